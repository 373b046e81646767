# mypy: disable-error-code="import-not-found,import-untyped,misc,untyped-decorator"
# (verifiers ships no type information; this file runs in its virtualenv, not ours.)
"""vfray's built-in arithmetic taskset re-written against ``verifiers.v1`` (docs/v1/tasksets.md).

Same seeded operand pairs, same prompts ("What is a + b?") and the same exact-match reward on the
last integer of the reply as ``vfray.tasksets.arithmetic``, so both frameworks run identical work.
This module runs inside the verifiers virtualenv; it must not import vfray.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator

import verifiers.v1 as vf

_INTEGER = re.compile(r"-?\d+")


class ArithmeticData(vf.TaskData):
    a: int
    b: int
    answer: int


class ArithmeticTask(vf.Task[ArithmeticData]):
    @vf.reward
    async def correct(self, trace: vf.Trace) -> float:
        found = _INTEGER.findall(trace.last_reply or "")
        return float(bool(found) and int(found[-1]) == self.data.answer)

    @vf.metric
    async def reply_chars(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply or ""))


class ArithmeticConfig(vf.TasksetConfig):
    num_tasks: int = 200
    max_operand: int = 100
    seed: int = 0


class ArithmeticTaskset(vf.Taskset[ArithmeticTask, ArithmeticConfig]):
    def _pairs(self) -> Iterator[tuple[int, int]]:
        # The same draw as vfray.tasksets.arithmetic.ArithmeticTaskset._pairs.
        rng = random.Random(self.config.seed)
        seen: set[tuple[int, int]] = set()
        while True:
            pair = (rng.randrange(self.config.max_operand), rng.randrange(self.config.max_operand))
            if pair not in seen:
                seen.add(pair)
                yield pair

    def load(self) -> Iterator[ArithmeticTask]:
        for index, (a, b) in enumerate(self._pairs()):
            if index >= self.config.num_tasks:
                return
            data = ArithmeticData(idx=index, prompt=f"What is {a} + {b}?", a=a, b=b, answer=a + b)
            yield ArithmeticTask(data, self.config.task)
