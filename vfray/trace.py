"""The typed record of one rollout: its model calls, message graph, branches, scores and errors.

Each distinct chat message is stored once in ``Trace.graph`` under a content hash; a
:class:`Branch` is one linear, append-only context (a list of message ids), and each branch is
one training sample. :meth:`Trace.record_call` is the single place where turns are added.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import time
import uuid
from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, computed_field


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no whitespace: the form every vfray hash is taken over."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


class Message(BaseModel):
    """One chat message in OpenAI chat shape; unknown provider fields are kept, not dropped."""

    model_config = ConfigDict(frozen=True, extra="allow")

    role: str
    content: Any = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None

    @functools.cached_property
    def id(self) -> str:
        """Content address: equal messages share one id, so the graph stores them once.
        Cached: it is asked for on every recorded call (the hot path of the proxy)."""
        payload = canonical_json(self.model_dump(exclude_none=True))
        return hashlib.sha256(payload.encode()).hexdigest()[:20]

    @property
    def text(self) -> str:
        """The content flattened to text (list-of-parts content joins its text parts)."""
        return content_text(self.content)


def content_text(content: Any) -> str:
    """Flatten OpenAI/Anthropic style content (str or list of parts) to plain text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict):
                text = part.get("text")
                if isinstance(text, str):
                    parts.append(text)
        return "".join(parts)
    return str(content)


class StopCondition(str, Enum):
    """Why a rollout's agent phase ended.

    ``terminated`` conditions mean the task itself ended (the agent finished, or a stop hook
    judged it done); ``truncated`` ones mean a budget cut it short; the rest are failures.
    """

    COMPLETED = "completed"
    STOP_HOOK = "stop_hook"
    USER_CLOSED = "user_closed"
    MAX_TURNS = "max_turns"
    MAX_INPUT_TOKENS = "max_input_tokens"
    MAX_OUTPUT_TOKENS = "max_output_tokens"
    MAX_TOTAL_TOKENS = "max_total_tokens"
    MAX_USER_TURNS = "max_user_turns"
    CONTEXT_LENGTH = "context_length"
    TIMEOUT = "timeout"
    ERROR = "error"
    CANCELLED = "cancelled"

    @property
    def terminated(self) -> bool:
        return self in _TERMINATED

    @property
    def truncated(self) -> bool:
        return self in _TRUNCATED


_TERMINATED = frozenset(
    {StopCondition.COMPLETED, StopCondition.STOP_HOOK, StopCondition.USER_CLOSED}
)
_TRUNCATED = frozenset(
    {
        StopCondition.MAX_TURNS,
        StopCondition.MAX_INPUT_TOKENS,
        StopCondition.MAX_OUTPUT_TOKENS,
        StopCondition.MAX_TOTAL_TOKENS,
        StopCondition.MAX_USER_TURNS,
        StopCondition.CONTEXT_LENGTH,
        StopCondition.TIMEOUT,
    }
)


class Usage(BaseModel):
    """Token counts of one call, or summed over a trace."""

    model_config = ConfigDict(frozen=True)

    input_tokens: int = 0
    output_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
        )


ARTIFACT_LIMIT = 8 * 1024 * 1024
"""Characters of one kept file stored on the trace (its head; longer ones are marked truncated)."""


class AgentArtifact(BaseModel):
    """A text file kept from the box after the agent: the harness's own transcript
    (mini-swe-agent's trajectory, Codex's JSON events) or a path the task names in
    ``TaskData.artifacts`` (named by that path)."""

    model_config = ConfigDict(frozen=True)

    @classmethod
    def of_bytes(cls, name: str, raw: bytes) -> AgentArtifact:
        """The file's text (undecodable bytes replaced), its head when it is too long."""
        text = raw.decode("utf-8", errors="replace")
        return cls(name=name, content=text[:ARTIFACT_LIMIT], truncated=len(text) > ARTIFACT_LIMIT)

    name: str
    """The file's name, e.g. ``trajectory.json``."""
    content: str
    truncated: bool = False
    """True when the file was longer than the harness keeps (its head is kept)."""


class ErrorInfo(BaseModel):
    """A typed error recorded as data; ``type`` is the class name from :mod:`vfray.errors`."""

    model_config = ConfigDict(frozen=True)

    type: str
    message: str
    phase: str | None = None
    detail: str | None = None

    @classmethod
    def from_exception(cls, exc: BaseException, phase: str | None = None) -> ErrorInfo:
        return cls(type=type(exc).__name__, message=str(exc) or repr(exc), phase=phase)


class ModelCall(BaseModel):
    """One real exchange with the model endpoint, exactly as the interception saw it."""

    model_config = ConfigDict(frozen=True)

    index: int
    dialect: str = "chat"
    model: str = ""
    sampling: dict[str, Any] = Field(default_factory=dict)
    request_ids: list[str] = Field(default_factory=list)
    """Message ids (into ``Trace.graph``) of the request's history, in order."""
    response_id: str | None = None
    branch: int = 0
    usage: Usage = Field(default_factory=Usage)
    started_at: float = 0.0
    ended_at: float = 0.0
    finish_reason: str | None = None
    streamed: bool = False
    error: ErrorInfo | None = None
    policy_version: int | None = None
    tools: list[dict[str, Any]] | None = None
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    completion_logprobs: list[float] | None = None

    @property
    def latency(self) -> float:
        return max(0.0, self.ended_at - self.started_at)


class SideCall(BaseModel):
    """One model call vfray made itself for the rollout, not the agent's: a simulated user's
    turn or a judge's verdict. Kept in ``Trace.side_calls``, apart from ``calls``, so it never
    counts against the agent's limits nor lands in a training sample."""

    model_config = ConfigDict(frozen=True)

    kind: str
    """``user`` or ``judge``."""
    name: str
    """The user's or judge's name (a judge's is its reward key)."""
    model: str = ""
    messages: list[Message] = Field(default_factory=list)
    """The request's messages, in order."""
    reply: str | None = None
    usage: Usage = Field(default_factory=Usage)
    started_at: float = 0.0
    ended_at: float = 0.0
    error: ErrorInfo | None = None
    """Why this attempt gave nothing usable (the endpoint failed, the answer did not parse)."""


class ToolCall(BaseModel):
    """One MCP tool call the agent made, as the tool server saw it."""

    model_config = ConfigDict(frozen=True)

    server: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    result: str | None = None
    """What the agent got back (after an ``@intercept`` rewrite, when one applied)."""
    original_result: str | None = None
    """The tool's own result when an ``@intercept`` hook rewrote it, else None."""
    error: ErrorInfo | None = None
    """A ``ToolError`` when the tool raised, timed out or returned too much."""
    started_at: float = 0.0
    ended_at: float = 0.0

    @property
    def duration(self) -> float:
        return max(0.0, self.ended_at - self.started_at)


class Branch(BaseModel):
    """One linear, append-only context: message ids in order, and the calls that grew it."""

    id: int
    message_ids: list[str] = Field(default_factory=list)
    call_indices: list[int] = Field(default_factory=list)


class RewardRecord(BaseModel):
    """One named score: its value (None when its hook failed or was skipped) and weight."""

    model_config = ConfigDict(frozen=True)

    value: float | None
    weight: float = 1.0
    group: bool = False
    error: str | None = None


class TaskRecord(BaseModel):
    """What a trace keeps of its task: the data as JSON plus its durable identity."""

    model_config = ConfigDict(frozen=True)

    key: str
    hash: str
    type: str = "vfray.task:TaskData"
    data: dict[str, Any] = Field(default_factory=dict)


class AgentInfo(BaseModel):
    """Who ran the rollout: harness, runtime, model and the imposed sampling parameters."""

    model_config = ConfigDict(frozen=True)

    harness: str = ""
    runtime: str = ""
    model: str = ""
    sampling: dict[str, Any] = Field(default_factory=dict)
    name: str | None = None
    """The :class:`vfray.Agent`'s name when the rollout was one seat of a multi-agent episode."""


class PhaseTiming(BaseModel):
    """Wall-clock start and end (epoch seconds) of one rollout phase."""

    start: float
    end: float | None = None

    @property
    def duration(self) -> float | None:
        return None if self.end is None else max(0.0, self.end - self.start)


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
