"""The write-a-file agent taskset both sides of ``mini_swe_agent.py`` run (vfray's copy; the
verifiers copy is ``vf_side/vfbench_write``): the agent must write a line to ``out.txt``; the
reward reads the file in the box."""

from __future__ import annotations

from collections.abc import Iterator

import vfray as vf
from vfray.runtimes.base import Runtime

PROMPT = 'Write "hello agent" to out.txt, then check it.'


class WriteTask(vf.Task[vf.TaskData]):
    @vf.reward
    async def wrote_it(self, runtime: Runtime) -> bool:
        return (await runtime.read("out.txt")) == b"hello agent\n"


class WriteTaskset(vf.Taskset[WriteTask]):
    name = "write"

    def __init__(self, num_tasks: int = 8) -> None:
        self.num_tasks = num_tasks

    def load(self) -> Iterator[WriteTask]:
        for index in range(self.num_tasks):
            yield WriteTask(vf.TaskData(prompt=PROMPT), key=f"write-{index}")
