"""The segment model: one exchange is a launch, then resumes that each carry a new user turn.

:class:`HarnessSession` runs the segments of one rollout and charges the agent budget only while
a segment runs, so the time spent waiting for a user is never counted against the agent.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Literal, TypeAlias

from pydantic import BaseModel, ConfigDict

from vfray.errors import PhaseTimeoutError
from vfray.harness import Harness, LaunchContext, with_conversation
from vfray.runtimes.base import ProgramResult, Runtime
from vfray.trace import Message

UserTurn: TypeAlias = str | Message | Sequence[Message] | None
"""What a user says next: text, one message, several messages, or None to end the exchange."""
UserTurns: TypeAlias = (
    "AsyncIterator[UserTurn] | Callable[[HarnessSession], Awaitable[UserTurn] | UserTurn]"
)
"""A source of user turns: an async iterator, or a (sync or async) callable given the session."""


class Segment(BaseModel):
    """One run of the harness program: which kind, how long it ran and how it exited."""

    model_config = ConfigDict(frozen=True)

    index: int
    kind: Literal["launch", "resume"]
    duration: float
    exit_code: int | None
    """None when the segment did not finish (it ran out of budget)."""
    timed_out: bool = False


def user_messages(turn: UserTurn) -> list[Message] | None:
    """Normalise a user turn to messages; None (or nothing) ends the exchange."""
    if turn is None:
        return None
    if isinstance(turn, str):
        return [Message(role="user", content=turn)]
    if isinstance(turn, Message):
        return [turn]
    messages = [m if isinstance(m, Message) else Message.model_validate(m) for m in turn]
    return messages or None


class HarnessSession:
    """Runs one rollout's segments against a cumulative agent budget.

    ``history``, when given, returns the conversation so far (e.g. the trace's messages as the
    interception recorded them); otherwise the transcript the program left in the box is used.
    """

    def __init__(
        self,
        harness: Harness,
        ctx: LaunchContext,
        runtime: Runtime,
        *,
        budget: float | None = None,
        history: Callable[[], Sequence[Message]] | None = None,
    ) -> None:
        self.harness = harness
        self.ctx = ctx
        self.runtime = runtime
        self.budget = ctx.timeout if budget is None else budget
        self.history = history
        self.segments: list[Segment] = []
        self.results: list[ProgramResult] = []
        self.agent_time = 0.0
        """Seconds spent inside segments; waiting between them is not counted."""
        self._conversation: list[Message] = []

    @property
    def remaining(self) -> float | None:
        """Agent seconds left, or None when there is no budget."""
        return None if self.budget is None else max(0.0, self.budget - self.agent_time)

    @property
    def last_result(self) -> ProgramResult | None:
        return self.results[-1] if self.results else None

    async def conversation(self) -> list[Message]:
        """The conversation so far: from ``history``, else the box's transcript."""
        if self.history is not None:
            return list(self.history())
        transcript = await self.harness.read_transcript(self.runtime)
        return transcript if transcript is not None else list(self._conversation)

    async def turn(self, messages: UserTurn = None) -> ProgramResult:
        """Run the next segment: the launch first (with ``messages`` appended to the task's prompt
        when given, e.g. when the user speaks first), then a resume carrying ``messages``."""
        new = user_messages(messages) or []
        remaining = self.remaining
        if remaining is not None and remaining <= 0:
            raise PhaseTimeoutError(f"the agent budget of {self.budget:g}s is used up")
        ctx = self.ctx.model_copy(update={"timeout": remaining})
        if not self.segments:
            kind: Literal["launch", "resume"] = "launch"
            prompt = [Message.model_validate(m) for m in self.harness.resolve_prompt(ctx.data)]
            self._conversation = [*prompt, *new]
            if new:
                ctx = with_conversation(ctx, self._conversation)
            call = self.harness.launch(ctx, self.runtime)
        else:
            kind = "resume"
            self._conversation = [*await self.conversation(), *new]
            call = self.harness.resume(ctx, self.runtime, self._conversation)
        started = time.monotonic()
        try:
            result = await asyncio.wait_for(call, timeout=remaining)
        except asyncio.TimeoutError:
            self._account(kind, time.monotonic() - started, None, timed_out=True)
            raise PhaseTimeoutError(f"the agent budget of {self.budget:g}s ran out") from None
        except BaseException:
            self._account(kind, time.monotonic() - started, None)
            raise
        self._account(kind, time.monotonic() - started, result.exit_code, result.timed_out)
        self.results.append(result)
        return result

    def _account(
        self,
        kind: Literal["launch", "resume"],
        duration: float,
        code: int | None,
        timed_out: bool = False,
    ) -> None:
        self.agent_time += duration
        self.segments.append(
            Segment(
                index=len(self.segments),
                kind=kind,
                duration=duration,
                exit_code=code,
                timed_out=timed_out,
            )
        )


async def next_user_turn(user_turns: UserTurns, session: HarnessSession) -> list[Message] | None:
    """Ask the user source for its next turn (untimed); None when the user is done."""
    if isinstance(user_turns, AsyncIterator):
        try:
            turn: UserTurn = await anext(user_turns)
        except StopAsyncIteration:
            return None
    else:
        produced = user_turns(session)
        turn = await produced if inspect.isawaitable(produced) else produced
    return user_messages(turn)


async def run_segments(
    harness: Harness,
    ctx: LaunchContext,
    runtime: Runtime,
    user_turns: UserTurns | None = None,
    *,
    budget: float | None = None,
    history: Callable[[], Sequence[Message]] | None = None,
    stopped: Callable[[], bool] | None = None,
    max_segments: int = 100,
) -> HarnessSession:
    """Launch, then resume with each user turn until the user is done, a segment fails, a limit
    stopped the rollout (``stopped()``), or ``max_segments`` ran. When the task has no prompt
    the user speaks first. Returns the session: its results, segments and agent time; the
    caller classifies the last result with :func:`vfray.harness.classify_exit`.

    Raises :class:`PhaseTimeoutError` when the cumulative budget runs out mid-segment.
    """
    session = HarnessSession(harness, ctx, runtime, budget=budget, history=history)
    first: list[Message] | None = None
    if ctx.data.prompt is None and user_turns is not None:
        first = await next_user_turn(user_turns, session)
        if first is None:
            return session
    result = await session.turn(first)
    while user_turns is not None and len(session.segments) < max_segments:
        if not result.ok or (stopped is not None and stopped()):
            break
        turn = await next_user_turn(user_turns, session)
        if turn is None:
            break
        result = await session.turn(turn)
    return session
