"""A vfray trace seen the way v1's hooks see a ``verifiers.v1.Trace``: ``trace.task.data`` is the
v1 row, ``last_reply`` is stripped text, ``rewards`` hold ``Reward(score, weight)``,
``record_reward`` / ``record_metric`` write through to the vfray trace, and ``stop_condition``
uses v1's names."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vfray.compat.v1._data import TaskData
from vfray.compat.v1._types import Request, Response, Reward, Usage
from vfray.episode import seat_role
from vfray.trace import Message, RewardRecord, StopCondition
from vfray.trace import Trace as VfrayTrace

_HOOK_NOTE = re.compile(r"^stop hook '([^']+)' ended the rollout$")


@dataclass(frozen=True)
class TraceTask:
    type: str
    data: TaskData
    key: str
    hash: str


@dataclass(frozen=True)
class TraceAgent:
    name: str
    model: str
    harness: str
    trainable: bool = True


class Trace:
    """v1's view of one vfray trace (``verifiers.v1.Trace`` for hooks)."""

    def __init__(self, trace: VfrayTrace, task: TraceTask) -> None:
        self._trace = trace
        self.task = task
        self.info: dict[str, Any] = {}
        self.state: dict[str, Any] = {}

    @property
    def vfray(self) -> VfrayTrace:
        """The vfray trace behind this view."""
        return self._trace

    @property
    def id(self) -> str:
        return self._trace.trace_id

    @property
    def agent(self) -> TraceAgent:
        """Who played it: in a multi-agent env, the seat's name (v1's ``agent.name`` stamp; a
        seat's every run carries it, ``golfer#2`` is ``golfer``)."""
        info = self._trace.agent
        name = seat_role(self._trace.seat) or "agent"
        return TraceAgent(name, info.model, info.harness, info.trainable)

    @property
    def messages(self) -> list[Message]:
        return self._trace.messages

    @property
    def assistant_messages(self) -> list[Message]:
        return [m for m in self.messages if m.role == "assistant"]

    @property
    def tool_messages(self) -> list[Message]:
        return [m for m in self.messages if m.role == "tool"]

    @property
    def last_reply(self) -> str:
        return (self._trace.last_reply or "").strip()

    @property
    def transcript(self) -> str:
        return "\n\n".join(f"{m.role}: {m.text}" for m in self.messages if m.role != "tool")

    @property
    def num_turns(self) -> int:
        return self._trace.num_turns

    @property
    def rewards(self) -> dict[str, Reward | None]:
        return {
            k: None if r.value is None else Reward(score=r.value, weight=r.weight)
            for k, r in self._trace.rewards.items()
        }

    @property
    def metrics(self) -> dict[str, float | None]:
        return self._trace.metrics

    @property
    def reward(self) -> float:
        return sum(r.value for r in self.rewards.values() if r is not None)

    def record_reward(self, name: str, value: float, weight: float = 1.0) -> None:
        self._trace.rewards[name] = RewardRecord(value=float(value), weight=float(weight))

    def record_metric(self, name: str, value: float) -> None:
        self._trace.metrics[name] = float(value)

    def record_metrics(self, values: Mapping[str, float]) -> None:
        for name, value in values.items():
            self.record_metric(name, value)

    @property
    def stop_condition(self) -> str | None:
        return v1_stop_condition(self._trace)

    @property
    def is_completed(self) -> bool:
        return self._trace.stop_condition is not None

    @property
    def is_truncated(self) -> bool:
        condition = self._trace.stop_condition
        if condition is not None and condition.truncated:
            return True
        calls = self._trace.calls
        return bool(calls) and calls[-1].finish_reason == "length"

    @property
    def ok(self) -> bool:
        return self._trace.ok

    @property
    def errors(self) -> list[Any]:
        return list(self._trace.errors)

    @property
    def usage(self) -> Any:
        return self._trace.usage


def v1_stop_condition(trace: VfrayTrace) -> str | None:
    """The stop condition under v1's name: ``agent_completed``, a limit's name, or the name of
    the ``@stop`` that fired."""
    condition = trace.stop_condition
    if condition is None:
        return None
    if condition is StopCondition.COMPLETED:
        return "agent_completed"
    if condition is StopCondition.STOP_HOOK:
        for note in reversed(trace.notes):
            found = _HOOK_NOTE.match(note)
            if found:
                return str(found.group(1))
    return str(condition.value)


def request_of(messages: list[Message], tools: list[Any] | None) -> Request:
    return Request(messages=list(messages), tools=tools)


def last_response(trace: VfrayTrace) -> Response | None:
    """The newest sampled reply as v1's ``Response``, or None before the first one."""
    for call in reversed(trace.calls):
        if call.response_id is not None:
            return Response(
                id=call.response_id,
                created=int(call.ended_at),
                model=call.model,
                message=trace.graph[call.response_id],
                finish_reason=call.finish_reason,
                usage=Usage(
                    prompt_tokens=call.usage.input_tokens or 0,
                    completion_tokens=call.usage.output_tokens or 0,
                ),
            )
    return None
