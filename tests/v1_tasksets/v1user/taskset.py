# mypy: ignore-errors
"""A user-simulation taskset as v1's docs show (run with ``--env.id user-sim``): the row's prompt
is the USER's scenario (for the scripted ``user`` model: the lines it says, each after ``> ``),
scoring reads only non-prompt fields, the assistant learns the goal through the conversation."""

from __future__ import annotations

import verifiers.v1 as vf

SCENARIOS = [
    ("> What is 2 + 3?\n> What is 4 + 4?", "8"),
    ("> What is 10 + 1?", "11"),
]


class ChatData(vf.TaskData):
    answer: str


class ChatTask(vf.Task[ChatData]):
    @vf.reward
    async def correct(self, trace: vf.Trace) -> float:
        return float(trace.last_reply == self.data.answer)

    @vf.metric
    async def replies(self, trace: vf.Trace) -> float:
        return float(len(trace.assistant_messages))


class Chats(vf.Taskset):
    def load(self):
        for scenario, answer in SCENARIOS:
            yield ChatTask(ChatData(prompt=scenario, answer=answer), self.config.task)
