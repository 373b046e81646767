"""Runtime lookup by name: ``make_runtime("bwrap", spec)`` builds a runtime from configuration,
with the same lookup rule as harnesses and tasksets (:class:`~vfray._plugins.Registry`), and
:func:`runtime_options` types a runtime's options from its constructor, as ``HarnessConfig``
types a harness's.

Implementations are imported lazily so a missing optional extra (docker, modal) only matters
when that runtime is asked for.
"""

from __future__ import annotations

import builtins
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from vfray._plugins import (
    OpenPluginOptions,
    PluginOptions,
    Registry,
    options_model,
    validate_options,
)
from vfray.errors import ConfigError
from vfray.runtimes.base import Runtime, RuntimeSpec
from vfray.task import TaskData

if TYPE_CHECKING:
    from vfray.harnesses.base import Harness

logger = logging.getLogger(__name__)

RUNTIMES: dict[str, str] = {
    "subprocess": "vfray.runtimes.subprocess:SubprocessRuntime",
    "bwrap": "vfray.runtimes.bwrap:BwrapRuntime",
    "docker": "vfray.runtimes.docker:DockerRuntime",
    "podman": "vfray.runtimes.podman:PodmanRuntime",
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


class RuntimeOptions(PluginOptions):
    """A runtime's options, typed from its constructor's keyword-only parameters."""


class OpenRuntimeOptions(OpenPluginOptions, RuntimeOptions):
    """The options of a runtime whose constructor takes ``**options``: unknown keys kept."""

    model_config = OpenPluginOptions.model_config


def options_type(cls: type[Runtime]) -> type[RuntimeOptions]:
    """The :class:`RuntimeOptions` model of ``cls``: one field per keyword-only parameter of
    its constructor (after the spec), with its annotation and default."""
    model = options_model(
        cls, skip=1, keyword_only=True, base=RuntimeOptions, open_base=OpenRuntimeOptions
    )
    assert issubclass(model, RuntimeOptions)
    return model


def runtime_options(type: str, options: Mapping[str, Any] | None = None) -> RuntimeOptions:
    """Validate ``options`` for runtime ``type`` (ConfigError, one line, when invalid)."""
    typed = validate_options(options_type(runtime_class(type)), options, f"runtime {type!r}")
    assert isinstance(typed, RuntimeOptions)
    return typed


def task_spec(data: TaskData) -> RuntimeSpec:
    """What a task asks of its box. Here, not on :class:`RuntimeSpec`: the runtime contract must
    not import the task model, whose hooks name the contract in their signatures."""
    return RuntimeSpec(
        image=data.image,
        workdir=data.workdir,
        cpu=data.resources.cpu,
        memory_gb=data.resources.memory,
        disk_gb=data.resources.disk,
        gpu=data.resources.gpu,
        **({"pids": data.resources.pids} if data.resources.pids is not None else {}),
        network_allow=tuple(data.network_allow),
        network_block=tuple(data.network_block),
    )


def image_runtimes() -> list[str]:
    """The built-in runtimes that can box a task in its image."""
    from vfray.runtimes.images import runs_images

    return [name for name in RUNTIMES if runs_images(runtime_class(name))]


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
