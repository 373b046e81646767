"""Runtime lookup by name: ``make_runtime("bwrap", spec)`` builds a runtime from configuration.

Implementations are imported lazily so a missing optional extra (docker, modal) only matters
when that runtime is asked for.
"""

from __future__ import annotations

import builtins
import difflib
import importlib
from typing import Any

from vfray.errors import ConfigError
from vfray.runtimes.base import Runtime, RuntimeSpec

RUNTIMES: dict[str, str] = {
    "subprocess": "vfray.runtimes.subprocess:SubprocessRuntime",
    "bwrap": "vfray.runtimes.bwrap:BwrapRuntime",
    "docker": "vfray.runtimes.docker:DockerRuntime",
    "modal": "vfray.runtimes.modal:ModalRuntime",
}
"""Built-in runtime names and their classes (``module:Class``)."""


def runtime_class(type: str) -> type[Runtime]:
    """The runtime class registered as ``type``, or a ``module:Class`` path to a plugin."""
    target = RUNTIMES.get(type, type if ":" in type else None)
    if target is None:
        near = difflib.get_close_matches(type, RUNTIMES, n=1)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        raise ConfigError(
            f"unknown runtime {type!r}{hint} (known: {', '.join(sorted(RUNTIMES))}, "
            "or a 'package.module:Class' path)"
        )
    module_name, _, attr = target.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        if type in RUNTIMES:
            raise
        raise ConfigError(f"cannot import runtime {type!r}: {exc}") from exc
    if not (isinstance(cls, builtins.type) and issubclass(cls, Runtime)):
        raise ConfigError(f"{target!r} is not a vfray Runtime subclass")
    return cls


def make_runtime(type: str, spec: RuntimeSpec | None = None, **options: Any) -> Runtime:
    """Build the runtime named ``type`` for one rollout; ``options`` go to its constructor."""
    cls = runtime_class(type)
    try:
        return cls(spec, **options)
    except TypeError as exc:
        raise ConfigError(f"bad options for runtime {type!r}: {exc}") from exc
