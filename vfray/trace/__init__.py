"""The typed record of one rollout: its model calls, message graph, branches, scores and errors.

Each distinct chat message is stored once in ``Trace.graph`` under a content hash; a
:class:`Branch` is one linear, append-only context (a list of message ids), and each branch is
one training sample. :meth:`Trace.record_call` is the single place where turns are added.

A package rather than one module so :class:`Trace` stays here, at its public path, while the
messages (:mod:`vfray.trace.messages`) and the frozen records it nests
(:mod:`vfray.trace.records`) are modules of their own, re-exported here; they never import this
package. (:mod:`vfray.traces`, plural, is the Parquet side.)

Internal: importable, but not the public API (:mod:`vfray`, :mod:`vfray.testing`,
:mod:`vfray.train`, :mod:`vfray.compat.v1`); names here may move.
"""

from __future__ import annotations

import math
import time
import uuid
from typing import Any

from pydantic import BaseModel, Field, computed_field

from vfray.trace.messages import Branch, Message, canonical_json, content_text
from vfray.trace.records import (
    ARTIFACT_LIMIT,
    AgentArtifact,
    AgentInfo,
    ErrorInfo,
    ModelCall,
    PhaseTiming,
    RewardRecord,
    SideCall,
    StopCondition,
    TaskRecord,
    ToolCall,
    Usage,
)

__all__ = [
    "ARTIFACT_LIMIT",
    "AgentArtifact",
    "AgentInfo",
    "Branch",
    "ErrorInfo",
    "Message",
    "ModelCall",
    "PhaseTiming",
    "RewardRecord",
    "SideCall",
    "StopCondition",
    "TaskRecord",
    "ToolCall",
    "Trace",
    "Usage",
    "canonical_json",
    "content_text",
    "new_id",
]


def new_id() -> str:
    return uuid.uuid4().hex


class Trace(BaseModel):
    """The record of one rollout attempt.

    Mutable on purpose: the interception appends calls and the rollout fills in phases while
    it runs; everything nested in it is a frozen record.
    """

    trace_id: str = Field(default_factory=new_id)
    run_id: str | None = None
    episode_id: str | None = None
    rollout_index: int = 0
    attempt: int = 0
    seat: str | None = None
    """The seat this trace played in a multi-agent episode (:mod:`vfray.harnesses.seats`); None
    otherwise."""
    task: TaskRecord
    agent: AgentInfo = Field(default_factory=AgentInfo)
    graph: dict[str, Message] = Field(default_factory=dict)
    branch_list: list[Branch] = Field(default_factory=list)
    calls: list[ModelCall] = Field(default_factory=list)
    rewards: dict[str, RewardRecord] = Field(default_factory=dict)
    metrics: dict[str, float | None] = Field(default_factory=dict)
    advantage: float | None = None
    turn_rewards: dict[int, float] = Field(default_factory=dict)
    """Per-turn rewards a task gave (call index -> reward; :meth:`set_turn_reward`), apart
    from the outcome ``reward``. The samples carry them on each turn's last sampled token."""
    stop_condition: StopCondition | None = None
    errors: list[ErrorInfo] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    """Non-fatal observations (a skipped hook, an ignored retry) a user should be able to see."""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    """MCP tool calls of the rollout, in the order they were made (``vfray.tools``)."""
    artifacts: list[AgentArtifact] = Field(default_factory=list)
    """Files the harness kept from the box
    (:meth:`vfray.harnesses.base.Harness.collect_artifacts`)."""
    timing: dict[str, PhaseTiming] = Field(default_factory=dict)
    segments: list[PhaseTiming] = Field(default_factory=list)
    """Wall-clock span of each run of the agent inside the agent phase: the launch, then one per
    user message it resumed on (the calls between a span's ends are that segment's turns)."""
    side_calls: list[SideCall] = Field(default_factory=list)
    """Calls of the rollout's simulated user and judges, in order (never the agent's)."""
    created_at: float = Field(default_factory=time.time)

    # -- derived views -------------------------------------------------------------------

    @computed_field  # type: ignore[prop-decorator]
    @property
    def reward(self) -> float | None:
        """Weighted sum of the rewards that have a value; None when nothing was scored, or
        when the sum overflows the float range (an infinite mean would poison the group)."""
        scored = [r for r in self.rewards.values() if r.value is not None]
        if not scored:
            return None
        total = float(sum(r.value * r.weight for r in scored if r.value is not None))
        return total if math.isfinite(total) else None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def usage(self) -> Usage:
        total = Usage()
        for call in self.calls:
            total = total + call.usage
        return total

    @property
    def side_usage(self) -> Usage:
        """Tokens of the side calls (simulated user, judges): spent, but not by the agent."""
        total = Usage()
        for call in self.side_calls:
            total = total + call.usage
        return total

    @property
    def ok(self) -> bool:
        """True when no error was recorded (a limit stop is not an error)."""
        return not self.errors

    @property
    def num_turns(self) -> int:
        """Model calls that produced a response."""
        return sum(1 for c in self.calls if c.response_id is not None)

    @property
    def branches(self) -> list[list[Message]]:
        """Every branch as its list of messages, in creation order."""
        return [self.branch_messages(b) for b in self.branch_list]

    def branch_messages(self, branch: Branch) -> list[Message]:
        return [self.graph[mid] for mid in branch.message_ids]

    @property
    def messages(self) -> list[Message]:
        """The conversation of the branch that the last call grew (the final context)."""
        if not self.calls:
            return []
        last = self.calls[-1]
        for branch in self.branch_list:
            if branch.id == last.branch:
                return self.branch_messages(branch)
        return []

    @property
    def last_reply(self) -> str | None:
        """Text of the last assistant message the model produced, if any."""
        for call in reversed(self.calls):
            if call.response_id is not None:
                return self.graph[call.response_id].text
        return None

    def error(self) -> ErrorInfo | None:
        """The first recorded error (the cause; later ones are consequences)."""
        return self.errors[0] if self.errors else None

    # -- recording ------------------------------------------------------------------------

    def add_message(self, message: Message) -> str:
        mid = message.id
        self.graph.setdefault(mid, message)
        return mid

    def record_call(
        self,
        request: list[Message],
        response: Message | None,
        **fields: Any,
    ) -> ModelCall:
        """Append one model call, storing its messages once and placing it on a branch.

        The call extends the longest branch whose messages are a prefix of the request;
        if none is (history was compacted, edited, or a sub-agent started afresh), a new
        branch begins. ``fields`` are the remaining :class:`ModelCall` fields.
        """
        request_ids = [m.id for m in request]
        response_id = response.id if response is not None else None
        branch = self._branch_for(request_ids)
        # Every id on a branch went into the graph with it, so the branch's prefix of the
        # request is stored already: only the rest is added, in order (the same graph as adding
        # all of it), and a long conversation's turn costs its new tail, not its history.
        for message in request[len(branch.message_ids) :]:
            self.add_message(message)
        if response is not None:
            self.add_message(response)
        index = len(self.calls)
        if response_id is not None:
            branch.message_ids = [*request_ids, response_id]
        elif len(request_ids) > len(branch.message_ids):
            branch.message_ids = list(request_ids)
        branch.call_indices.append(index)
        call = ModelCall(
            index=index,
            request_ids=request_ids,
            response_id=response_id,
            branch=branch.id,
            **fields,
        )
        self.calls.append(call)
        return call

    def _branch_for(self, request_ids: list[str]) -> Branch:
        best: Branch | None = None
        for branch in self.branch_list:
            n = len(branch.message_ids)
            is_prefix = n <= len(request_ids) and request_ids[:n] == branch.message_ids
            if is_prefix and (best is None or n > len(best.message_ids)):
                best = branch
        if best is None:
            best = Branch(id=len(self.branch_list))
            self.branch_list.append(best)
        return best

    # -- phases and outcome ----------------------------------------------------------------

    def set_turn_reward(self, call: int | ModelCall, value: float) -> None:
        """Give one model call (a turn: ``trace.calls[i]`` or its index) a reward of its own,
        from a ``@vf.reward`` hook (which returns the outcome reward as usual). The samples put
        it on that turn's last sampled token (``completion_rewards``; batches'
        ``token_level_rewards``, verl's name); it is not part of ``trace.reward``."""
        index = call.index if isinstance(call, ModelCall) else call
        if not isinstance(index, int) or not 0 <= index < len(self.calls):
            raise ValueError(f"no model call {index!r} in this trace ({len(self.calls)} calls)")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"a turn reward is a number, got {type(value).__name__}")
        if not math.isfinite(value):
            raise ValueError(f"a turn reward must be finite, got {value}")
        self.turn_rewards[index] = float(value)

    def start_phase(self, phase: str) -> None:
        self.timing[phase] = PhaseTiming(start=time.time())

    def end_phase(self, phase: str) -> None:
        timing = self.timing.get(phase)
        if timing is not None and timing.end is None:
            timing.end = time.time()

    def add_error(self, exc: BaseException, phase: str | None = None) -> ErrorInfo:
        info = ErrorInfo.from_exception(exc, phase)
        self.errors.append(info)
        return info

    def stop(self, condition: StopCondition) -> bool:
        """Set the stop condition unless one is already set; returns whether it was set."""
        if self.stop_condition is None:
            self.stop_condition = condition
            return True
        return False
