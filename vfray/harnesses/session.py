"""One rollout's agent program across its segments: the launch, then one resume per user message.

:func:`run_segments` is the rollout's agent loop (segment 1, then one more per message the task's
user (:mod:`vfray.harnesses.users`, else its ``next_message``) supplies, under one agent budget that
waiting for the user does not burn), over an :class:`AgentSession`: by default one that
relaunches the program on the conversation so far; a live-session harness (ACP) gives its own,
which keeps one process and session.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, cast

from vfray.errors import TaskError
from vfray.harnesses.base import AgentSession, LaunchContext, run_until_stopped
from vfray.harnesses.users import TaskUser, task_user
from vfray.runtimes.base import ProgramResult
from vfray.task import Task
from vfray.trace import PhaseTiming, StopCondition, Trace
from vfray.trace.messages import UserContent, is_user_content

log = logging.getLogger(__name__)

MAX_SEGMENTS = 100
"""Segments one rollout may run (a task whose next_message never returns None ends here)."""


async def _segment_until_stopped(
    session: AgentSession,
    ctx: LaunchContext,
    message: UserContent | None,
    stopped: Callable[[], bool],
    grace: float,
    interrupt: Callable[[], Awaitable[int]] | None,
) -> ProgramResult:
    # The segment's coroutine is made here, inside the task wait_for runs, not by the caller:
    # a rollout cancelled before that task's first step (its loop closing) would otherwise
    # leave a "coroutine was never awaited" warning behind.
    return await run_until_stopped(session.segment(ctx, message), stopped, grace, interrupt)


async def run_segments(
    task: Task[Any],
    trace: Trace,
    session: AgentSession,
    ctx: LaunchContext,
    *,
    budget: float,
    user_deadline: float,
    stop_grace: float,
    interrupt: Callable[[], Awaitable[int]] | None = None,
    view: Callable[[], Awaitable[Trace]] | None = None,
    max_user_turns: int | None = None,
) -> tuple[ProgramResult | None, float]:
    """Run segment 1, then one more per message the task's user supplies, until it supplies
    none (a declared user: ``USER_CLOSED``), ``max_user_turns`` is reached
    (``MAX_USER_TURNS``), a segment fails, the interception stopped the rollout, or the agent
    budget (charged only while a segment runs) is spent. Returns the last segment's result
    (None: out of budget) and the agent seconds spent. Each segment's span is kept in
    ``trace.segments``; the user is asked (untimed for the agent) only between segments, and
    sees ``view()``: the trace with the calls so far (a remote broker's snapshot merged into
    ``trace``; its side calls are copied back). ``interrupt`` (the box's SIGTERM) is what a
    refused call sends the program first."""
    spent = 0.0
    user = task_user(task)
    said = 0
    current = view or _local(trace)
    message: UserContent | None = None
    if task.data.prompt is None:  # the user speaks first
        if max_user_turns == 0:
            raise TaskError("the task has no prompt and max_user_turns=0 lets no user open it")
        message = await _next_message(user, trace, await current(), user_deadline)
        if message is None:
            raise TaskError(f"the task has no prompt and its user ({user.name}) said nothing")
        said += 1
    result: ProgramResult | None = None
    for _ in range(MAX_SEGMENTS):
        remaining = budget - spent
        span = PhaseTiming(start=time.time())
        trace.segments.append(span)
        started = time.monotonic()
        try:
            # In this process the session records into ``trace`` itself, so a refusal shows
            # here at once; a remote session's copy does not, and its program ends on its own.
            program = _segment_until_stopped(
                session,
                ctx.model_copy(update={"timeout": remaining}),
                message,
                lambda: trace.stop_condition is not None,
                stop_grace,
                interrupt,
            )
            result = await asyncio.wait_for(program, timeout=remaining)
        except TimeoutError:
            log.info("agent phase of %s hit its %gs budget", task.key[:12], budget)
            return None, spent + time.monotonic() - started
        finally:
            spent += time.monotonic() - started
            span.end = time.time()
        if not result.ok or trace.stop_condition is not None:
            break
        seen = await current()
        if seen.stop_condition is not None:  # a remote interception refused a call
            break
        if max_user_turns is not None and said >= max_user_turns:
            # The user is not asked again (a simulated one would spend a call to be ignored).
            trace.stop(StopCondition.MAX_USER_TURNS)
            break
        message = await _next_message(user, trace, seen, user_deadline)
        if message is None:
            if user.declared:
                trace.stop(StopCondition.USER_CLOSED)
            break
        said += 1
    else:
        trace.notes.append(f"the exchange ended after {MAX_SEGMENTS} segments")
    return result, spent


def _local(trace: Trace) -> Callable[[], Awaitable[Trace]]:
    async def view() -> Trace:
        return trace

    return view


async def _next_message(
    user: TaskUser, trace: Trace, seen: Trace, deadline: float
) -> UserContent | None:
    """The user's next message (under its own deadline, not the agent's), asked on ``seen``;
    the side calls it made there are kept on ``trace``."""
    before = len(seen.side_calls)
    try:
        message = await asyncio.wait_for(user.ask(seen), deadline)
    except TimeoutError:
        raise TaskError(f"{user.name} did not answer within {deadline:g}s") from None
    except Exception as exc:
        raise TaskError(f"{user.name} failed: {type(exc).__name__}: {exc}") from exc
    finally:
        if seen is not trace:
            trace.side_calls.extend(seen.side_calls[before:])
    if message is not None and not is_user_content(message):
        raise TaskError(
            f"{user.name} must return a str, a list of content parts (dicts with a 'type') or "
            f"None, got {type(message).__name__}"
        )
    return cast("UserContent | None", message)
