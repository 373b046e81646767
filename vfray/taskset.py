"""Tasksets: a lazily iterated source of Tasks, with lazy ``head``, seeded ``shuffle`` and ``view``.

Subclasses implement ``load()`` (a list, or a generator for large or infinite sources). Views
never copy the parent: ``ts.shuffle().head(5)`` builds tasks only when iterated, and every
taskset (views included) pickles with cloudpickle so it can be shipped to Ray workers.

Internal: importable, but not the public API (:mod:`vfray`, :mod:`vfray.testing`,
:mod:`vfray.train`, :mod:`vfray.compat.v1`); names here may move.
"""

from __future__ import annotations

import abc
import itertools
import random
import re
import typing
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, ClassVar, Generic, TypeVar

from vfray.errors import TasksetError
from vfray.task import Task

TaskT = TypeVar("TaskT", bound=Task[Any])


def snake_case(name: str) -> str:
    """``GSM8KTaskset`` -> ``gsm8k_taskset``; used for run-folder names."""
    name = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    name = re.sub(r"([a-z])([A-Z])", r"\1_\2", name)
    return name.strip("_").lower()


class Taskset(abc.ABC, Generic[TaskT]):
    """A source of tasks.

    Set ``INFINITE = True`` when ``load()`` never ends; such a taskset must be bounded with
    ``head(n)`` before anything that needs all tasks (``shuffle``, ``len``). Task keys must be
    unique; a duplicate raises :class:`TasksetError` while iterating, naming the key.
    """

    INFINITE: ClassVar[bool] = False
    task_class: ClassVar[type[Task[Any]] | None] = None
    """The Task class of this taskset; found from ``Taskset[MyTask]`` when not set."""
    name: str = "taskset"
    """Name used in run folders; defaults to the class name in snake case."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" not in cls.__dict__:
            cls.name = snake_case(cls.__name__)

    @abc.abstractmethod
    def load(self) -> Iterable[TaskT]:
        """Return the tasks: a list, or an iterator/generator that builds them on demand."""

    # -- iteration ---------------------------------------------------------------------------

    @property
    def is_infinite(self) -> bool:
        return type(self).INFINITE

    def __iter__(self) -> Iterator[TaskT]:
        # Duplicate detection is incremental so an infinite source is never materialised.
        seen: dict[str, int] = {}
        for index, task in enumerate(self.load()):
            if not isinstance(task, Task):
                raise TasksetError(
                    f"taskset {self.name!r} yielded {type(task).__name__} at index {index}, "
                    "expected a vf.Task"
                )
            first = seen.setdefault(task.key, index)
            if first != index:
                raise TasksetError(
                    f"taskset {self.name!r} has duplicate task key {task.key!r} "
                    f"(tasks {first} and {index}); keys must be unique for resume to work"
                )
            yield task

    def __len__(self) -> int:
        if self.is_infinite:
            raise TasksetError(f"taskset {self.name!r} is infinite; bound it with head(n) first")
        loaded = self.load()
        if isinstance(loaded, Sequence):
            return len(loaded)
        return sum(1 for _ in loaded)

    def tasks(self) -> list[TaskT]:
        """All tasks as a list (checked for duplicate keys)."""
        if self.is_infinite:
            raise TasksetError(f"taskset {self.name!r} is infinite; bound it with head(n) first")
        return list(self)

    # -- views -------------------------------------------------------------------------------

    def head(self, n: int) -> Taskset[TaskT]:
        """The first ``n`` tasks; lazy, so only ``n`` tasks are ever built."""
        if n < 0:
            raise TasksetError(f"head(n) needs n >= 0, got {n}")
        return _Head(self, n)

    def shuffle(self, seed: int = 0) -> Taskset[TaskT]:
        """The tasks in a seeded random order (same seed, same order on every machine)."""
        if self.is_infinite:
            raise TasksetError(
                f"cannot shuffle infinite taskset {self.name!r}: bound it first, "
                "e.g. taskset.head(1000).shuffle()"
            )
        return _Shuffled(self, seed)

    def view(self, fn: Callable[[TaskT], TaskT | None]) -> Taskset[TaskT]:
        """Map each task through ``fn``; a ``None`` result drops the task (a filter).

        Views compose: ``ts.view(f).view(g)`` applies ``f`` then ``g``, lazily.
        """
        return _View(self, fn)

    # -- types -------------------------------------------------------------------------------

    @property
    def task_type(self) -> type[Task[Any]]:
        """The Task class of this taskset's tasks (used to validate group rewards up front).

        From ``task_class``, else the type argument of ``Taskset[MyTask]`` in the class
        bases, else the type of the first task (building one task), else ``Task``.
        """
        found = _declared_task_type(type(self))
        if found is not None:
            return found
        first = next(iter(self.load()), None)
        return type(first) if isinstance(first, Task) else Task

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


def _declared_task_type(cls: type) -> type[Task[Any]] | None:
    for klass in cls.__mro__:
        explicit = klass.__dict__.get("task_class")
        if isinstance(explicit, type) and issubclass(explicit, Task):
            return explicit
        for base in klass.__dict__.get("__orig_bases__", ()):
            if typing.get_origin(base) is None:
                continue
            origin = typing.get_origin(base)
            if isinstance(origin, type) and issubclass(origin, Taskset):
                for arg in typing.get_args(base):
                    target = typing.get_origin(arg) or arg
                    if isinstance(target, type) and issubclass(target, Task):
                        return target
    return None


class _Derived(Taskset[TaskT]):
    """A view over a parent taskset; inherits its name and task type."""

    def __init__(self, parent: Taskset[TaskT]) -> None:
        self.parent = parent
        self.name = parent.name

    @property
    def is_infinite(self) -> bool:
        return self.parent.is_infinite

    @property
    def task_type(self) -> type[Task[Any]]:
        return self.parent.task_type

    def __repr__(self) -> str:
        return f"{self.parent!r}.{type(self).__name__.strip('_').lower()}()"


class _Head(_Derived[TaskT]):
    def __init__(self, parent: Taskset[TaskT], n: int) -> None:
        super().__init__(parent)
        self.n = n

    @property
    def is_infinite(self) -> bool:
        return False

    def load(self) -> Iterable[TaskT]:
        # The parent's load(), not its __iter__: duplicate checks happen once, at the outermost.
        return itertools.islice(self.parent.load(), self.n)

    def __len__(self) -> int:
        if self.parent.is_infinite:
            return self.n
        return min(self.n, len(self.parent))


class _Shuffled(_Derived[TaskT]):
    def __init__(self, parent: Taskset[TaskT], seed: int) -> None:
        super().__init__(parent)
        self.seed = seed

    def load(self) -> list[TaskT]:
        tasks = list(self.parent.load())
        # random.Random(int) is stable across processes and Python versions for shuffle.
        random.Random(self.seed).shuffle(tasks)
        return tasks


class _View(_Derived[TaskT]):
    def __init__(self, parent: Taskset[TaskT], fn: Callable[[TaskT], TaskT | None]) -> None:
        super().__init__(parent)
        self.fn = fn

    def load(self) -> Iterator[TaskT]:
        for task in self.parent.load():
            mapped = self.fn(task)
            if mapped is not None:
                yield mapped


class ListTaskset(Taskset[TaskT]):
    """A taskset over tasks already in memory (handy in tests and notebooks)."""

    def __init__(self, tasks: Iterable[TaskT], name: str = "list_taskset") -> None:
        self._tasks = list(tasks)
        self.name = name

    def load(self) -> list[TaskT]:
        return self._tasks
