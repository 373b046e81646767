"""The built-in ``arithmetic`` taskset: "What is 12 + 30?" questions, scored by exact match
on the last integer of the reply.

Copy it as a template: a typed ``TaskData``, a ``Task`` with a reward, a metric and a group
reward, and a seeded ``Taskset`` (plus an endless variant for RL).
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from typing import Any

import vfray as vf

_INTEGER = re.compile(r"-?\d+")


class ArithmeticData(vf.TaskData):
    a: int
    b: int
    answer: int


def last_integer(text: str | None) -> int | None:
    """The last integer in ``text`` (models tend to state the result last)."""
    found = _INTEGER.findall(text or "")
    return int(found[-1]) if found else None


class ArithmeticTask(vf.Task[ArithmeticData]):
    @vf.reward
    def correct(self, trace: vf.Trace) -> bool:
        return last_integer(trace.last_reply) == self.data.answer

    @vf.metric
    def reply_chars(self, trace: vf.Trace) -> int:
        return len(trace.last_reply or "")

    @vf.group_reward(weight=0.1)
    def brevity_rank(self, traces: list[vf.Trace]) -> list[float]:
        """Among the correct replies, the shortest gets 1.0 and the longest 0.0; wrong ones 0."""
        lengths = [
            len(t.last_reply or "") if last_integer(t.last_reply) == self.data.answer else None
            for t in traces
        ]
        ranked = sorted({n for n in lengths if n is not None})
        if len(ranked) < 2:
            return [0.0 if n is None else 1.0 for n in lengths]
        top = len(ranked) - 1
        return [0.0 if n is None else 1.0 - ranked.index(n) / top for n in lengths]


class SoloArithmeticTask(ArithmeticTask):
    """The same task without its group reward, for runs of one rollout per task (a rank among
    one rollout means nothing): what ``group_rewards=False`` yields."""

    brevity_rank = None  # type: ignore[assignment]  # None removes an inherited hook


def make_task(a: int, b: int, *, group_rewards: bool = True) -> ArithmeticTask:
    data = ArithmeticData(prompt=f"What is {a} + {b}?", a=a, b=b, answer=a + b)
    cls = ArithmeticTask if group_rewards else SoloArithmeticTask
    return cls(data, key=f"{a}+{b}")


class ArithmeticTaskset(vf.Taskset[ArithmeticTask]):
    """``num_tasks`` distinct sums with operands below ``max_operand``, drawn from ``seed``;
    ``group_rewards=False`` leaves out the group reward (for one rollout per task)."""

    name = "arithmetic"

    def __init__(
        self,
        num_tasks: int = 100,
        max_operand: int = 100,
        seed: int = 0,
        group_rewards: bool = True,
    ) -> None:
        if num_tasks > max_operand**2:
            raise vf.ConfigError(f"only {max_operand**2} distinct sums exist below {max_operand}")
        self.num_tasks = num_tasks
        self.max_operand = max_operand
        self.seed = seed
        self.group_rewards = group_rewards

    @property
    def task_type(self) -> type[vf.Task[Any]]:
        return ArithmeticTask if self.group_rewards else SoloArithmeticTask

    def _pairs(self) -> Iterator[tuple[int, int]]:
        rng = random.Random(self.seed)
        seen: set[tuple[int, int]] = set()
        while True:
            pair = (rng.randrange(self.max_operand), rng.randrange(self.max_operand))
            if pair not in seen:
                seen.add(pair)
                yield pair

    def load(self) -> Iterator[ArithmeticTask]:
        for index, (a, b) in enumerate(self._pairs()):
            if index >= self.num_tasks:
                return
            yield make_task(a, b, group_rewards=self.group_rewards)


class EndlessArithmetic(vf.Taskset[ArithmeticTask]):
    """An endless stream of sums (keys never repeat); bound it with ``head(n)``."""

    INFINITE = True
    name = "arithmetic_endless"

    def __init__(self, seed: int = 0, group_rewards: bool = True) -> None:
        self.seed = seed
        self.group_rewards = group_rewards

    @property
    def task_type(self) -> type[vf.Task[Any]]:
        return ArithmeticTask if self.group_rewards else SoloArithmeticTask

    def load(self) -> Iterator[ArithmeticTask]:
        rng = random.Random(self.seed)
        for index in range(10**18):
            a, b = rng.randrange(1000), rng.randrange(1000)
            task = make_task(a, b, group_rewards=self.group_rewards)
            # The index in the key keeps keys unique even when a pair comes up twice.
            yield type(task)(task.data, key=f"{index}:{a}+{b}")


def taskset(**kwargs: Any) -> ArithmeticTaskset:
    """Entry point for config: ``taskset = "vfray.tasksets.arithmetic:taskset"``."""
    return ArithmeticTaskset(**kwargs)
