"""One rollout's agent program across its segments: the launch, then one resume per user message.

:func:`run_segments` is the rollout's agent loop (segment 1, then one more per message the task's
``next_message`` supplies, under one agent budget that waiting for the user does not burn), over
an :class:`AgentSession`: by default one that relaunches the program on the conversation so far;
a live-session harness (ACP) gives its own, which keeps one process and session.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from vfray.errors import TaskError
from vfray.harness import LaunchContext, run_until_stopped, with_conversation
from vfray.runtimes.base import ProgramResult, Runtime
from vfray.task import Task, call_maybe_async
from vfray.trace import Message, PhaseTiming, Trace

if TYPE_CHECKING:
    from vfray.harness import Harness

log = logging.getLogger(__name__)

MAX_SEGMENTS = 100
"""Segments one rollout may run (a task whose next_message never returns None ends here)."""


class AgentSession:
    """The default session: each segment is one run of the program to its exit."""

    def __init__(
        self, harness: Harness, runtime: Runtime, history: Callable[[], Sequence[Message]]
    ) -> None:
        self.harness = harness
        self.runtime = runtime
        self.history = history
        """The conversation as the interception recorded it (used when the box has none)."""
        self.segments = 0

    async def segment(self, ctx: LaunchContext, message: str | None) -> ProgramResult:
        """Run the next segment and wait for it to end. The first is the launch on the task's
        prompt (with ``message`` appended when the user speaks first); each later one resumes
        the conversation with ``message`` as the new user turn."""
        self.segments += 1
        new = [] if message is None else [Message(role="user", content=message)]
        if self.segments == 1:
            if new:
                prompt = [Message.model_validate(m) for m in self.harness.resolve_prompt(ctx.data)]
                ctx = with_conversation(ctx, [*prompt, *new])
            return await self.harness.launch(ctx, self.runtime)
        transcript = await self.harness.read_transcript(self.runtime)
        history = transcript if transcript is not None else list(self.history())
        return await self.harness.resume(ctx, self.runtime, [*history, *new])

    async def close(self) -> None:
        """End whatever the session still runs (always called, also after a failure)."""


async def run_segments(
    task: Task[Any],
    trace: Trace,
    session: AgentSession,
    ctx: LaunchContext,
    *,
    budget: float,
    user_deadline: float,
    stop_grace: float,
    interrupt: Callable[[], Awaitable[None]] | None = None,
) -> tuple[ProgramResult | None, float]:
    """Run segment 1, then one more per message the task supplies, until it supplies none, a
    segment fails, the interception stopped the rollout, or the agent budget (charged only
    while a segment runs) is spent. Returns the last segment's result (None: out of budget)
    and the agent seconds spent. Each segment's span is kept in ``trace.segments``; the
    task is asked for its next message (untimed for the agent) only between segments.
    ``interrupt`` (the box's SIGTERM) is what a refused call sends the program first."""
    spent = 0.0
    message: str | None = None
    if task.data.prompt is None:  # the user speaks first
        message = await _next_message(task, trace, user_deadline)
        if message is None:
            raise TaskError("the task has no prompt and next_message gave none")
    result: ProgramResult | None = None
    for _ in range(MAX_SEGMENTS):
        remaining = budget - spent
        span = PhaseTiming(start=time.time())
        trace.segments.append(span)
        started = time.monotonic()
        try:
            # In this process the session records into ``trace`` itself, so a refusal shows
            # here at once; a remote session's copy does not, and its program ends on its own.
            program = run_until_stopped(
                session.segment(ctx.model_copy(update={"timeout": remaining}), message),
                lambda: trace.stop_condition is not None,
                stop_grace,
                interrupt,
            )
            result = await asyncio.wait_for(program, timeout=remaining)
        except asyncio.TimeoutError:
            log.info("agent phase of %s hit its %gs budget", task.key[:12], budget)
            return None, spent + time.monotonic() - started
        finally:
            spent += time.monotonic() - started
            span.end = time.time()
        if not result.ok or trace.stop_condition is not None:
            break
        message = await _next_message(task, trace, user_deadline)
        if message is None:
            break
    else:
        trace.notes.append(f"the exchange ended after {MAX_SEGMENTS} segments")
    return result, spent


async def _next_message(task: Task[Any], trace: Trace, deadline: float) -> str | None:
    """The task's next user message (under its own deadline, not the agent's)."""
    try:
        message = await asyncio.wait_for(call_maybe_async(task.next_message, trace), deadline)
    except asyncio.TimeoutError:
        raise TaskError(f"next_message did not answer within {deadline:g}s") from None
    except Exception as exc:
        raise TaskError(f"next_message failed: {type(exc).__name__}: {exc}") from exc
    if message is not None and not isinstance(message, str):
        raise TaskError(f"next_message must return a str or None, got {type(message).__name__}")
    return message
