"""The agent phase of a rollout: open an interception session, run the harness's segments in the
box, close the session and merge the broker's record of the model calls into the rollout's trace,
then judge how the agent ended (completed, timed out, or failed, and whose fault)."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from typing import Any

from vfray.errors import HarnessError, ProviderError, RolloutError, SandboxError
from vfray.harnesses.base import AgentSession, Harness, LaunchContext, classify_exit
from vfray.harnesses.session import run_segments
from vfray.rollout.plan import RolloutPlan, SessionBroker, Timeouts
from vfray.runtimes.base import Runtime
from vfray.scoring import HookKind, check_stop, select_hooks
from vfray.task import Task
from vfray.tools.attach import RolloutTools
from vfray.trace import StopCondition, Trace


async def run_agent_phase(
    task: Task[Any],
    trace: Trace,
    plan: RolloutPlan,
    harness: Harness,
    runtime: Runtime,
    broker: SessionBroker,
    interception_url: str,
    timeouts: Timeouts,
    tools: RolloutTools | None = None,
) -> Trace:
    """Open a session, run the harness's segments, close the session; returns the recorded
    trace."""
    deadline = timeouts.agent
    trace.start_phase("agent")
    secret: str | None = None
    try:
        # A task without @stop hooks asks nothing before each call (the interception's limits
        # still apply): the ask itself cost ~40 us a call, most of it finding no hook.
        has_stop = bool(select_hooks(task, plan.scoring_overrides, HookKind.STOP))
        secret = await broker.register(
            trace,
            plan.limits,
            (lambda t: check_stop(task, t, plan.scoring_overrides, timeouts.stop))
            if has_stop
            else None,
            plan.sampling,
        )
        live = secret
        endpoint = await runtime.host_url(broker.endpoint(secret) or interception_url)
        await runtime.prepare_execution([endpoint, *(tools.routes if tools else ())])
        ctx = LaunchContext(
            endpoint=endpoint,
            secret=secret,
            model=plan.model,
            data=task.data,
            timeout=deadline,
            mcp_servers=tools.urls if tools else {},
            seat=plan.seat,
        )
        session = harness.open_session(runtime, lambda: trace.messages)
        try:
            result, spent = await run_segments(
                task,
                trace,
                session,
                ctx,
                budget=timeouts.agent,
                user_deadline=timeouts.user,
                stop_grace=timeouts.stop_grace,
                interrupt=runtime.interrupt,
                view=lambda: _live_view(broker, live, trace),
                max_user_turns=plan.limits.max_user_turns,
            )
        finally:
            await session.close()
            # Kept whatever ended the segments (a failure above is when they matter most), but
            # not on cancellation, whose teardown must be prompt.
            if not isinstance(sys.exc_info()[1], asyncio.CancelledError):
                await _keep_artifacts(trace, harness, runtime, session)
        recorded = await broker.conclude(secret)
        secret = None
        trace = _merge_recorded(trace, recorded)
        if result is None:
            trace.stop(StopCondition.TIMEOUT)
            trace.notes.append(f"agent budget of {deadline:g}s used up after {spent:.1f}s")
        elif result.timed_out:
            # The program ran out its own clock: an agent budget stop, scored like one.
            trace.stop(StopCondition.TIMEOUT)
        else:
            stopped = trace.stop_condition is not None
            error = classify_exit(result, await runtime.alive(), stopped)
            if isinstance(error, HarnessError):
                hit = await runtime.limit_hit()
                if hit is not None:  # the box's limit killed it, not the program's own fault
                    error = SandboxError(f"the harness program was killed by the box's {hit}")
            if isinstance(error, HarnessError):
                error = _blame_provider(trace) or error
            if error is not None:
                trace.add_error(error, "agent")
                trace.stop(StopCondition.ERROR)
            else:
                trace.stop(StopCondition.COMPLETED)
    except (RolloutError, OSError) as exc:
        wrapped = exc if isinstance(exc, RolloutError) else SandboxError(str(exc))
        trace.add_error(wrapped, "agent")
        trace.stop(StopCondition.ERROR)
    except Exception as exc:
        trace.add_error(HarnessError(f"{type(exc).__name__}: {exc}"), "agent")
        trace.stop(StopCondition.ERROR)
    finally:
        if secret is not None:
            with contextlib.suppress(Exception):
                trace = _merge_recorded(trace, await broker.conclude(secret))
        if tools is not None:
            # Kept however the agent ended: the calls made before a crash are data too.
            with contextlib.suppress(Exception):
                trace.tool_calls = await tools.collect()
        trace.end_phase("agent")
    return trace


async def _keep_artifacts(
    trace: Trace, harness: Harness, runtime: Runtime, session: AgentSession
) -> None:
    try:
        trace.artifacts.extend(session.artifacts())
        trace.artifacts.extend(await harness.collect_artifacts(runtime))
    except Exception as exc:  # the agent's own transcript is a bonus, never a failure
        trace.notes.append(f"harness artifacts not kept: {type(exc).__name__}: {exc}")


def _blame_provider(trace: Trace) -> ProviderError | None:
    """A harness that gave up right after the model endpoint failed (after its own retries)
    failed because of the provider: say so, so the farm can retry the rollout."""
    if trace.calls and trace.calls[-1].error is not None:
        last = trace.calls[-1].error
        if last.type == ProviderError.__name__:
            return ProviderError(f"the model endpoint failed: {last.message}")
    return None


async def _live_view(broker: SessionBroker, secret: str, local: Trace) -> Trace:
    """The trace as the task's user should see it mid-rollout: the broker's record of the
    calls, with what the rollout itself recorded merged in (a copy when they differ)."""
    recorded = await broker.snapshot(secret)
    if recorded is local:
        return local
    # A shallow copy: the merge reassigns fields, and the broker's own record stays as it is.
    return _merge_recorded(local, recorded.model_copy())


def _merge_recorded(local: Trace, recorded: Trace) -> Trace:
    """The broker's trace holds the calls; keep the phases, errors, side calls and the
    user's ending the rollout recorded. In-process both are the same object; across
    processes the broker's copy is newer."""
    if recorded is local:
        return local
    if recorded.stop_condition is None:
        recorded.stop_condition = local.stop_condition
    recorded.side_calls = [*local.side_calls, *recorded.side_calls]
    recorded.timing = {**recorded.timing, **local.timing}
    recorded.segments = local.segments
    recorded.artifacts = [*local.artifacts, *recorded.artifacts]
    recorded.errors = [*local.errors, *recorded.errors]
    recorded.notes = [*local.notes, *recorded.notes]
    return recorded
