"""The frozen records a :class:`~vfray.trace.Trace` holds besides its messages: the model calls
the interception saw, the side calls of users and judges, MCP tool calls, token usage, errors,
rewards, phase timings, kept files, and what the trace keeps of its task and agent."""

from __future__ import annotations

from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from vfray.trace.messages import Message


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
    trainable: bool = True
    """False for a seat that does not train the run's policy (``vf.Seat(trainable=False)``: a
    judge, a simulated user): its trace gets no advantage and enters no batch."""


class PhaseTiming(BaseModel):
    """Wall-clock start and end (epoch seconds) of one rollout phase."""

    start: float
    end: float | None = None

    @property
    def duration(self) -> float | None:
        return None if self.end is None else max(0.0, self.end - self.start)
