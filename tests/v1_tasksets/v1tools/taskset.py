# mypy: ignore-errors
"""A task with its own toolset as v1's docs show (``Task.toolsets`` returning a ``Toolset`` with
``@vf.tool`` methods). The prompt is a plan for the scripted ``agent`` model: call the tool by
the name v1 advertises (``<snake-cased toolset>_<tool>``), then answer with its result; scoring
reads the reply and the trace."""

from __future__ import annotations

import verifiers.v1 as vf

from .tools import Doubler

ROWS = [(21, "42"), (5, "10")]


class ToolData(vf.TaskData):
    x: int
    answer: str


class ToolTask(vf.Task[ToolData]):
    @classmethod
    def toolsets(cls, config):
        return [Doubler(vf.ToolsetConfig())]

    @vf.reward
    async def doubled(self, trace: vf.Trace) -> float:
        return float(self.data.answer in (trace.last_reply or ""))

    @vf.metric
    async def turns(self, trace: vf.Trace) -> float:
        return float(trace.num_turns)


class Tools(vf.Taskset):
    def load(self):
        for x, answer in ROWS:
            prompt = f'tool: doubler_double {{"x": {x}}}'
            yield ToolTask(ToolData(prompt=prompt, x=x, answer=answer), self.config.task)
