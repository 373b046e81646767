"""verifiers v1's ``Taskset(config)``: ``load()`` builds tasks; iteration stamps each row's
``idx`` and the config's system prompt; lazy views (``include``/``exclude``/``shuffle``/``skip``/
``take``/``select``) compose iterator transforms on a shallow copy, as v1's do."""

from __future__ import annotations

import abc
import copy
import itertools
import random
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, Self

from pydantic import BaseModel, ConfigDict, Field
from typing_extensions import TypeVar

from vfray.compat.v1._data import TasksetConfig
from vfray.compat.v1._task import Task, TaskT, concrete_type
from vfray.errors import TasksetError

TasksetConfigT = TypeVar("TasksetConfigT", bound=TasksetConfig, default=TasksetConfig)
Transform = Callable[[Iterator[Any]], Iterator[Any]]


class TaskMatchConfig(BaseModel):
    """Tasks named by position (``"3"``, ``"0:100"``, ``"5:"``), id, key or name."""

    model_config = ConfigDict(extra="forbid")

    idx: list[str] = Field(default_factory=list)
    ids: list[str] = Field(default_factory=list)
    keys: list[str] = Field(default_factory=list)
    names: list[str] = Field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.idx or self.ids or self.keys or self.names)

    def ranges(self) -> list[range]:
        out = []
        for spec in self.idx:
            start, sep, stop = str(spec).partition(":")
            first = int(start or 0)
            out.append(range(first, (int(stop) if stop else 2**62) if sep else first + 1))
        return out

    @property
    def closed(self) -> bool:
        return bool(self.idx) and all(r.stop < 2**62 for r in self.ranges())


class SelectConfig(BaseModel):
    """Which tasks a run evaluates, applied in v1's fixed order."""

    model_config = ConfigDict(extra="forbid")

    include: TaskMatchConfig = Field(default_factory=TaskMatchConfig)
    exclude: TaskMatchConfig = Field(default_factory=TaskMatchConfig)
    shuffle: bool = False
    seed: int = 0
    skip: int = Field(0, ge=0)
    limit: int | None = Field(None, ge=1)


class Taskset(abc.ABC, Generic[TaskT, TasksetConfigT]):
    """A v1 taskset (``verifiers.v1.Taskset``): config in, tasks out."""

    INFINITE: bool = False
    transform: Transform | None = None
    _bounded: bool | None = None

    def __init__(self, config: TasksetConfigT) -> None:
        self.config = config
        override = config.system_prompt
        self.system_prompt = override.read_text() if override is not None else None

    @abc.abstractmethod
    def load(self) -> Iterable[TaskT]:
        """Build the tasks; may be a generator."""

    @property
    def bounded(self) -> bool:
        return not self.INFINITE if self._bounded is None else self._bounded

    def __iter__(self) -> Iterator[TaskT]:
        update = {} if self.system_prompt is None else {"system_prompt": self.system_prompt}
        tasks: Iterator[TaskT] = (
            task.with_data(idx=idx, **update) for idx, task in enumerate(self.load())
        )
        return tasks if self.transform is None else self.transform(tasks)

    def include(self, **match: Any) -> Self:
        config = TaskMatchConfig(**match)
        if not self.bounded and (config.ids or config.keys or config.names):
            raise TasksetError(f"{type(self).__name__} is infinite: include by idx ranges first")
        view = self._view(lambda tasks: _match(tasks, config, keep=True))
        if config.closed:
            view._bounded = True
        return view

    def exclude(self, **match: Any) -> Self:
        config = TaskMatchConfig(**match)
        return self._view(lambda tasks: _match(tasks, config, keep=False))

    def shuffle(self, seed: int = 0) -> Self:
        if not self.bounded:
            raise TasksetError(
                f"{type(self).__name__} is infinite - cannot shuffle; bound it first with take(n)"
            )

        def shuffled(tasks: Iterator[Any]) -> Iterator[Any]:
            items = list(tasks)
            random.Random(seed).shuffle(items)
            return iter(items)

        return self._view(shuffled)

    def skip(self, num_tasks: int) -> Self:
        return self._view(lambda tasks: itertools.islice(tasks, num_tasks, None))

    def take(self, num_tasks: int) -> Self:
        view = self._view(lambda tasks: itertools.islice(tasks, num_tasks))
        view._bounded = True
        return view

    def select(self, config: SelectConfig) -> Self:
        view = self
        if not config.include.empty:
            view = view.include(**config.include.model_dump())
        if not config.exclude.empty:
            view = view.exclude(**config.exclude.model_dump())
        if config.shuffle:
            view = view.shuffle(config.seed)
        if config.skip:
            view = view.skip(config.skip)
        if config.limit is not None:
            view = view.take(config.limit)
        return view

    def _view(self, transform: Transform) -> Self:
        clone = copy.copy(self)
        prev = self.transform
        clone.transform = transform if prev is None else lambda tasks: transform(prev(tasks))
        return clone

    @classmethod
    def task_type(cls) -> type[Task[Any, Any, Any]]:
        return concrete_type(cls, Task) or Task

    @classmethod
    def config_type(cls) -> type[TasksetConfig]:
        return concrete_type(cls, TasksetConfig) or TasksetConfig

    @classmethod
    def toolsets(cls, config: Any) -> list[Any]:
        """Shared tool servers (refused by vfray's loader)."""
        return []


def _match(tasks: Iterator[Any], match: TaskMatchConfig, keep: bool) -> Iterator[Any]:
    ranges = match.ranges()
    for task in tasks:
        idx = task.data.idx
        hit = (
            any(idx in r for r in ranges)
            or (match.ids and task.data.id in match.ids)
            or (match.keys and task.key in match.keys)
            or (match.names and task.data.name in match.names)
        )
        if bool(hit) == keep:
            yield task
