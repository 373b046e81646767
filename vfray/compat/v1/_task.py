"""verifiers v1's ``Task``: a row plus behaviour, built as ``Task(data, config)``; its key is v1's
content hash of the row, and its hooks are the decorated methods merged with the config's plugged
functions."""

from __future__ import annotations

import copy
import typing
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Self

from typing_extensions import TypeVar

from vfray.compat.v1._data import DecoratedFunctionConfig, TaskConfig, TaskData, task_key
from vfray.compat.v1._hooks import discover, plugged

if TYPE_CHECKING:
    from vfray.runtimes.base import Runtime


class State(dict[str, Any]):
    """Per-rollout mutable state (``trace.state``); a plain dict here (no tool servers yet)."""


DataT = TypeVar("DataT", bound=TaskData, default=TaskData)
StateT = TypeVar("StateT", default=State)
ConfigT = TypeVar("ConfigT", bound=TaskConfig, default=TaskConfig)


def concrete_type(cls: type, base: type) -> type | None:
    """The first subclass of ``base`` among the generic arguments in ``cls``'s bases."""
    for klass in cls.__mro__:
        for orig in klass.__dict__.get("__orig_bases__", ()):
            for arg in typing.get_args(orig):
                target = typing.get_origin(arg) or arg
                if isinstance(target, type) and issubclass(target, base):
                    return target
    return None


class Task(Generic[DataT, StateT, ConfigT]):
    """A v1 task (``verifiers.v1.Task``)."""

    NEEDS_CONTAINER: ClassVar[bool] = False
    scoring_deferred: bool = False

    def __init__(self, data: DataT, config: ConfigT | None = None) -> None:
        self.data = data
        self.config: ConfigT = config if config is not None else self.config_type()()  # type: ignore[assignment]

    @property
    def hash(self) -> str:
        return task_key(self.data.model_dump(mode="json", exclude_none=True))

    @property
    def key(self) -> str:
        return self.hash

    def with_data(self, **update: Any) -> Self:
        clone = copy.copy(self)
        clone.data = self.data.model_copy(update=update)
        return clone

    def with_system_prompt(self, system_prompt: str) -> Self:
        return self.with_data(system_prompt=system_prompt)

    def runtime_env(self) -> dict[str, str]:
        return {}

    async def setup(self, trace: Any, runtime: Runtime) -> None:
        return None

    async def finalize(self, trace: Any, runtime: Runtime) -> None:
        return None

    async def validate(self, runtime: Runtime) -> bool | None:
        """Check the ground truth; ``False`` rejects the task, ``None``: no model-free check."""
        return None

    @classmethod
    def data_type(cls) -> type[TaskData]:
        return concrete_type(cls, TaskData) or TaskData

    @classmethod
    def config_type(cls) -> type[TaskConfig]:
        return concrete_type(cls, TaskConfig) or TaskConfig

    @classmethod
    def toolsets(cls, config: Any) -> list[Any]:
        """Per-rollout tool servers (``Toolset`` instances; vfray serves them on the host)."""
        return []

    def hooks(self, attr: str) -> list[Callable[..., Any]]:
        """Decorated ``@<attr>`` methods merged with the config's plugged functions (a plugged
        one replaces the method of its name), by priority then name."""
        by_kind: dict[str, Mapping[str, DecoratedFunctionConfig]] = {
            "stop": self.config.stops,
            "metric": self.config.metrics,
            "reward": self.config.rewards,
        }
        plugged_specs = by_kind.get(attr, {})
        merged = {fn.__name__: fn for fn in discover(self, attr)}
        for name, spec in plugged_specs.items():
            meta = spec.model_dump(exclude={"fn"})
            merged[name] = plugged(name, spec.fn, attr, merged.get(name), **meta)
        fns = list(merged.values())
        fns.sort(key=lambda fn: (-getattr(fn, f"{attr}_priority", 0), fn.__name__))
        return fns

    def __repr__(self) -> str:
        return f"{type(self).__name__}(key={self.key[:12]!r})"


TaskT = TypeVar("TaskT", bound=Task[Any, Any, Any], default=Task)
