"""Runtime lookup by name: ``make_runtime("bwrap", spec)`` builds a runtime from configuration,
with the same lookup rule as harnesses and tasksets (:class:`~vfray.plugins.Registry`), and
:func:`runtime_options` types a runtime's options from its constructor, as ``HarnessConfig``
types a harness's.

Implementations are imported lazily so a missing optional extra (docker, modal) only matters
when that runtime is asked for.
"""

from __future__ import annotations

import builtins
import functools
import inspect
import logging
import typing
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from vfray.errors import ConfigError
from vfray.plugins import Registry
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


RUNTIME_REGISTRY = Registry(
    "runtime",
    RUNTIMES,
    group="vfray.runtimes",
    check=lambda obj: isinstance(obj, builtins.type) and issubclass(obj, Runtime),
    example="mypkg.boxes:MyRuntime",
)


def runtime_class(type: str) -> type[Runtime]:
    """The runtime class registered as ``type``, or an import path (``module:Class``,
    ``file.py:Class``) to a plugin."""
    cls: builtins.type[Runtime] = RUNTIME_REGISTRY.load(type)
    return cls


class RuntimeOptions(BaseModel):
    """A runtime's options, typed from its constructor's keyword parameters (frozen; an
    unknown key is refused). ``as_kwargs()`` gives back only the options that were set."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    def as_kwargs(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.model_fields_set}


class OpenRuntimeOptions(RuntimeOptions):
    """The options of a runtime whose constructor takes ``**options``: unknown keys kept."""

    model_config = ConfigDict(frozen=True, extra="allow", arbitrary_types_allowed=True)

    def as_kwargs(self) -> dict[str, Any]:
        return {**super().as_kwargs(), **(self.model_extra or {})}


@functools.cache
def options_type(cls: type[Runtime]) -> type[RuntimeOptions]:
    """The :class:`RuntimeOptions` model of ``cls``: one field per keyword parameter of its
    constructor, with its annotation and default."""
    try:
        hints = typing.get_type_hints(cls.__init__)
    except Exception:  # an annotation that names something not importable here
        hints = {}
    fields: dict[str, Any] = {}
    params = list(inspect.signature(cls.__init__).parameters.values())[2:]
    base: type[RuntimeOptions] = RuntimeOptions
    if any(p.kind is p.VAR_KEYWORD for p in params):
        base = OpenRuntimeOptions  # ``**options``: whatever else it is given goes through
    for param in params:
        name = param.name
        if param.kind is not param.KEYWORD_ONLY:
            continue
        default = ... if param.default is param.empty else param.default
        fields[name] = (hints.get(name, Any), default)
    model: type[RuntimeOptions] = create_model(f"{cls.__name__}Options", __base__=base, **fields)
    return model


def runtime_options(type: str, options: Mapping[str, Any] | None = None) -> RuntimeOptions:
    """Validate ``options`` for runtime ``type`` (ConfigError, one line, when invalid)."""
    cls = runtime_class(type)
    try:
        return options_type(cls).model_validate(dict(options or {}))
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}" for e in exc.errors()
        )
        raise ConfigError(f"bad options for runtime {type!r}: {problems}") from None


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
