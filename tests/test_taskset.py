"""Tasksets: laziness, head/shuffle/view, duplicate keys, names, task types, pickling."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cloudpickle  # type: ignore[import-untyped]
import pytest

from vfray._plugins import load_object
from vfray.errors import ConfigError, TasksetError
from vfray.scoring import group_reward, validate_group_config
from vfray.task import Task, TaskData
from vfray.taskset import ListTaskset, Taskset, snake_case

REPO = Path(__file__).resolve().parents[1]


class NumData(TaskData):
    number: int


class NumTask(Task[NumData]):
    pass


def num_task(i: int, key: str | None = None) -> NumTask:
    return NumTask(NumData(prompt=f"number {i}", number=i), key=key or f"n{i}")


class Counting(Taskset[NumTask]):
    """Counts how many tasks its generator has built."""

    def __init__(self, size: int | None = None) -> None:
        self.size = size
        self.built = 0

    def load(self) -> Iterator[NumTask]:
        numbers = itertools.count() if self.size is None else range(self.size)
        for i in numbers:
            self.built += 1
            yield num_task(i)


class Endless(Counting):
    INFINITE = True


class GSM8KTaskset(Taskset[NumTask]):
    def load(self) -> list[NumTask]:
        return [num_task(i) for i in range(3)]


def test_head_of_infinite_generator_builds_only_n() -> None:
    ts = Endless()
    head = ts.head(5)
    assert ts.built == 0  # making the view builds nothing
    assert [t.data.number for t in head] == [0, 1, 2, 3, 4]
    assert ts.built == 5
    assert len(head) == 5
    assert not head.is_infinite


def test_head_of_finite_taskset() -> None:
    ts = Counting(3)
    assert len(ts.head(10)) == 3
    assert [t.key for t in ts.head(2)] == ["n0", "n1"]
    assert list(ts.head(0)) == []
    with pytest.raises(TasksetError):
        ts.head(-1)


def test_shuffle_is_reproducible_and_a_permutation() -> None:
    ts = Counting(50)
    first = [t.key for t in ts.shuffle()]
    again = [t.key for t in Counting(50).shuffle(seed=0)]
    other = [t.key for t in ts.shuffle(seed=1)]
    assert first == again
    assert first != other
    assert first != [t.key for t in ts]
    assert sorted(first) == sorted(t.key for t in ts)


def test_shuffle_order_is_fixed_across_releases() -> None:
    # Pinned so a change in shuffle semantics (which would break resume) is noticed.
    assert [t.data.number for t in Counting(8).shuffle(seed=0)] == [4, 1, 5, 2, 0, 3, 7, 6]


def test_shuffle_of_unbounded_infinite_taskset_is_an_error() -> None:
    ts = Endless()
    with pytest.raises(TasksetError, match="infinite"):
        ts.shuffle()
    with pytest.raises(TasksetError, match="infinite"):
        ts.view(lambda t: t).shuffle()
    with pytest.raises(TasksetError, match="infinite"):
        len(ts)
    bounded = ts.head(10).shuffle(seed=3)
    assert sorted(t.data.number for t in bounded) == list(range(10))
    assert ts.built == 10


def test_duplicate_keys_raise_lazily_naming_the_key() -> None:
    class Dupes(Taskset[NumTask]):
        def load(self) -> Iterator[NumTask]:
            yield num_task(0, key="a")
            yield num_task(1, key="same-key")
            yield num_task(2, key="same-key")

    it = iter(Dupes())
    assert next(it).key == "a"
    assert next(it).key == "same-key"
    with pytest.raises(TasksetError, match="same-key") as info:
        next(it)
    assert "tasks 1 and 2" in str(info.value)
    # Bounding before the duplicate avoids it; a view creating a duplicate is caught too.
    assert len(list(Dupes().head(2))) == 2
    with pytest.raises(TasksetError, match="'x'"):
        list(Counting(3).view(lambda t: NumTask(t.data, key="x")))


def test_same_data_twice_is_a_duplicate_by_default() -> None:
    data = NumData(prompt="same", number=1)
    ts = ListTaskset([NumTask(data), NumTask(data)])
    with pytest.raises(TasksetError, match=data.hash):
        ts.tasks()


def test_view_maps_filters_and_composes() -> None:
    ts = Counting(10)

    def evens(t: NumTask) -> NumTask | None:
        return t if t.data.number % 2 == 0 else None

    def relabel(t: NumTask) -> NumTask:
        return NumTask(t.data, key=f"even-{t.data.number}")

    view = ts.view(evens).view(relabel)
    assert [t.key for t in view] == [f"even-{i}" for i in (0, 2, 4, 6, 8)]
    assert len(view) == 5
    assert [t.key for t in view.head(2)] == ["even-0", "even-2"]
    assert view.name == ts.name


def test_view_over_infinite_taskset_stays_lazy() -> None:
    ts = Endless()
    odds = ts.view(lambda t: t if t.data.number % 2 else None).head(3)
    assert [t.data.number for t in odds] == [1, 3, 5]
    assert ts.built == 6


def test_yielding_a_non_task_is_an_error() -> None:
    class Bad(Taskset[Any]):
        def load(self) -> list[Any]:
            return [NumData(prompt="q", number=1)]

    with pytest.raises(TasksetError, match="NumData"):
        list(Bad())


def test_names() -> None:
    assert snake_case("GSM8KTaskset") == "gsm8k_taskset"
    assert snake_case("SWEBenchVerified") == "swe_bench_verified"
    assert snake_case("MyTaskset") == "my_taskset"
    assert GSM8KTaskset().name == "gsm8k_taskset"
    assert GSM8KTaskset().shuffle().head(1).name == "gsm8k_taskset"

    class Named(GSM8KTaskset):
        name = "gsm8k"

    assert Named().name == "gsm8k"


def test_task_type_discovery() -> None:
    assert GSM8KTaskset().task_type is NumTask
    assert Counting(2).head(1).task_type is NumTask
    assert ListTaskset([num_task(1)]).task_type is NumTask
    assert ListTaskset([]).task_type is Task

    class Explicit(ListTaskset[Any]):
        task_class = NumTask

    assert Explicit([]).task_type is NumTask


def test_group_reward_validation_through_task_type() -> None:
    class Grouped(Task[NumData]):
        @group_reward
        def rank(self, traces: list[Any]) -> list[float]:
            return [0.0] * len(traces)

    class GroupedSet(Taskset[Grouped]):
        def load(self) -> list[Grouped]:
            return []

    validate_group_config(GroupedSet().task_type, 2)
    with pytest.raises(ConfigError, match="n must be at least 2"):
        validate_group_config(GroupedSet().task_type, 1)


def test_tasksets_and_views_pickle_with_cloudpickle() -> None:
    ts = Counting(20).view(lambda t: t if t.data.number > 3 else None).shuffle(seed=7).head(4)
    clone = cloudpickle.loads(cloudpickle.dumps(ts))
    assert [t.key for t in clone] == [t.key for t in ts]
    assert clone.name == ts.name


def test_example_arithmetic_taskset() -> None:
    make = load_object(str(REPO / "vfray" / "tasksets" / "arithmetic.py") + ":taskset")
    ts = make(num_tasks=20)
    tasks = ts.tasks()
    assert len(tasks) == 20 == len(ts)
    assert ts.name == "arithmetic"
    first = tasks[0]
    assert first.data.prompt == f"What is {first.data.a} + {first.data.b}?"
    assert first.data.answer == first.data.a + first.data.b
    assert [t.key for t in make(num_tasks=20)] == [t.key for t in tasks]  # seeded
    endless = load_object(
        str(REPO / "vfray" / "tasksets" / "arithmetic.py") + ":EndlessArithmetic"
    )()
    assert len(endless.head(1000).tasks()) == 1000
    with pytest.raises(TasksetError):
        endless.shuffle()
