"""Runtime lookup by name: ``make_runtime("bwrap", spec)`` builds a runtime from configuration.

Implementations are imported lazily so a missing optional extra (docker, modal) only matters
when that runtime is asked for.
"""

from __future__ import annotations

import builtins
import difflib
import importlib
import logging
from typing import TYPE_CHECKING, Any

from vfray.errors import ConfigError
from vfray.runtimes.base import Runtime, RuntimeSpec

if TYPE_CHECKING:
    from vfray.harness import Harness

logger = logging.getLogger(__name__)

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


def runtime_warnings(harness: type[Harness] | Harness, runtime_type: str) -> list[str]:
    """What a user should know about running ``harness`` in runtime ``runtime_type`` (empty
    when nothing): a harness that executes model-written code in a box with no isolation."""
    h = harness if isinstance(harness, builtins.type) else builtins.type(harness)
    runtime = runtime_class(runtime_type)
    notes = []
    if h.EXECUTES_CODE and runtime.warn_no_isolation:
        notes.append(
            f"harness {getattr(h, 'id', h.__name__)!r} executes model-written code, and runtime "
            f"{runtime.type!r} gives no isolation (the code runs as this user on this host and "
            "can escape the box's cleanup); use runtime 'bwrap' or 'docker' for untrusted code"
        )
    return notes


def preflight_runtime(
    harness: type[Harness] | Harness,
    runtime_type: str,
    options: dict[str, Any],
    *,
    boxes_here: bool = True,
) -> None:
    """At run start: refuse a runtime that cannot start boxes here (``ConfigError``, one line),
    and log :func:`runtime_warnings`. ``boxes_here=False`` (a driver whose boxes run on other
    nodes) only warns: this machine's engine says nothing about theirs."""
    if boxes_here:
        runtime_class(runtime_type).preflight(dict(options))
    for note in runtime_warnings(harness, runtime_type):
        logger.warning(note)
