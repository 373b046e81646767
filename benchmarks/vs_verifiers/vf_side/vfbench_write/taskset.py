# mypy: disable-error-code="import-not-found,import-untyped,misc,untyped-decorator"
# (verifiers ships no type information; this file runs in its virtualenv, not ours.)
"""``benchmarks/vs_verifiers/write_taskset.py`` re-written against ``verifiers.v1``: the agent
must write a line to ``out.txt``; the reward reads the file in the box. Must not import vfray."""

from __future__ import annotations

from collections.abc import Iterator

import verifiers.v1 as vf

PROMPT = 'Write "hello agent" to out.txt, then check it.'


class WriteTask(vf.Task[vf.TaskData]):
    @vf.reward
    async def wrote_it(self, runtime: vf.Runtime) -> float:
        return float((await runtime.read("out.txt")) == b"hello agent\n")


class WriteConfig(vf.TasksetConfig):
    num_tasks: int = 8


class WriteTaskset(vf.Taskset[WriteTask, WriteConfig]):
    def load(self) -> Iterator[WriteTask]:
        for index in range(self.config.num_tasks):
            yield WriteTask(vf.TaskData(idx=index, prompt=PROMPT), self.config.task)
