"""The per-rollout phased state machine: boot → setup → agent → finalize → scoring → teardown.

Each phase has its own deadline and timestamps in ``trace.timing``. Failures are recorded on the
trace as typed errors instead of raised, so one bad rollout never cancels its siblings; the
runtime is torn down whatever happens, cancellation included.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from vfray.endpoints.client import Target, rollout_target
from vfray.errors import (
    HarnessError,
    PhaseTimeoutError,
    ProviderError,
    RolloutError,
    SandboxError,
    TaskError,
)
from vfray.harnesses.base import Harness, LaunchContext, classify_exit
from vfray.harnesses.session import run_segments
from vfray.interception.limits import Limits
from vfray.runtimes.base import Runtime, RuntimeSpec
from vfray.runtimes.registry import make_runtime
from vfray.scoring import check_stop, score_rollout
from vfray.task import Task, TaskData, call_maybe_async
from vfray.tools.attach import RolloutTools, start_tools
from vfray.trace import AgentArtifact, AgentInfo, StopCondition, Trace

log = logging.getLogger(__name__)

PHASES = ("boot", "setup", "agent", "finalize", "scoring", "teardown")

SCORING_GRACE = 5.0
"""Seconds past the scoring deadline before the whole phase is abandoned (only when the hooks'
own deadline could not end it, e.g. an async hook that blocks the event loop)."""


class Timeouts(BaseModel):
    """Default per-phase deadlines in seconds; a task's own ``TaskData.timeout`` wins."""

    model_config = ConfigDict(frozen=True)

    boot: float = Field(120.0, gt=0, description="seconds to start the runtime box")
    setup: float = Field(600.0, gt=0, description="seconds for task.setup + harness.setup")
    agent: float = Field(1800.0, gt=0, description="agent budget in seconds (all segments)")
    user: float = Field(
        600.0, gt=0, description="seconds the task's user may take per message (not agent time)"
    )
    finalize: float = Field(600.0, gt=0, description="seconds for task.finalize")
    scoring: float = Field(600.0, gt=0, description="seconds for reward and metric hooks")
    teardown: float = Field(60.0, gt=0, description="seconds to stop the box")
    stop_grace: float = Field(
        5.0,
        gt=0,
        description="seconds between the SIGTERM a harness program gets once the interception "
        "refused a call (a limit, a stop hook) and the SIGKILL of its process group",
    )

    def for_task(self, data: TaskData) -> Timeouts:
        own = data.timeout.model_dump(exclude_none=True)
        return self.model_copy(update=own) if own else self


class SessionBroker(Protocol):
    """Where rollouts open and close interception sessions: the in-process app, or (on Ray)
    the node's interception deployment. ``conclude`` returns the recorded trace."""

    async def register(
        self,
        trace: Trace,
        limits: Limits,
        stop_check: Callable[[Trace], Awaitable[str | None]] | None,
        sampling: Mapping[str, Any] | None,
    ) -> str: ...

    async def conclude(self, secret: str) -> Trace: ...

    async def snapshot(self, secret: str) -> Trace:
        """The session's trace as recorded so far (in this process: the live object; across
        processes: a copy), for the task's user between segments."""
        ...

    def endpoint(self, secret: str) -> str | None:
        """The URL of the interception holding the session, when it is not the rollout's
        ``interception_url`` (a replica of a deployment answers for its own sessions)."""
        ...


class RolloutPlan(BaseModel):
    """Everything about a rollout other than its task, fixed for a whole run."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    model: str
    harness_id: str
    runtime_type: str
    sampling: dict[str, Any] = {}
    limits: Limits = Limits()
    timeouts: Timeouts = Timeouts()
    scoring_overrides: dict[str, str] = {}
    seat: str | None = None
    """The seat these rollouts play in a multi-agent episode (stamped on the trace)."""
    agent_name: str | None = None


class _PhaseFailed(Exception):
    """Internal: a phase failed and its error is already on the trace."""


async def _run_phase(
    trace: Trace,
    phase: str,
    deadline: float,
    work: Callable[[], Awaitable[Any]],
    wrap: type[RolloutError],
) -> Any:
    """Run one phase under its deadline; record and raise ``_PhaseFailed`` on failure."""
    trace.start_phase(phase)
    try:
        return await asyncio.wait_for(work(), timeout=deadline)
    except TimeoutError:
        trace.add_error(PhaseTimeoutError(f"{phase} phase exceeded {deadline:g}s"), phase)
        trace.stop(StopCondition.TIMEOUT)
        raise _PhaseFailed(phase) from None
    except RolloutError as exc:
        trace.add_error(exc, phase)
        raise _PhaseFailed(phase) from exc
    except Exception as exc:
        trace.add_error(wrap(f"{type(exc).__name__}: {exc}"), phase)
        raise _PhaseFailed(phase) from exc
    finally:
        trace.end_phase(phase)


async def execute_rollout(
    task: Task[Any],
    *,
    plan: RolloutPlan,
    harness: Harness,
    runtime: Runtime,
    broker: SessionBroker,
    interception_url: str,
    rollout_index: int = 0,
    attempt: int = 0,
    run_id: str | None = None,
    episode_id: str | None = None,
    model_target: Target | None = None,
) -> Trace:
    """Run one rollout of ``task`` to a scored :class:`Trace`; never raises for rollout
    failures (they are on the trace), only re-raises cancellation after tearing down.
    ``model_target`` is the rollout's model endpoint, where its simulated user and judges
    call by default."""
    with rollout_target(model_target):
        return await _execute(
            task,
            plan=plan,
            harness=harness,
            runtime=runtime,
            broker=broker,
            interception_url=interception_url,
            rollout_index=rollout_index,
            attempt=attempt,
            run_id=run_id,
            episode_id=episode_id,
        )


async def _execute(
    task: Task[Any],
    *,
    plan: RolloutPlan,
    harness: Harness,
    runtime: Runtime,
    broker: SessionBroker,
    interception_url: str,
    rollout_index: int,
    attempt: int,
    run_id: str | None,
    episode_id: str | None,
) -> Trace:
    timeouts = plan.timeouts.for_task(task.data)
    trace = Trace(
        task=task.record(),
        agent=AgentInfo(
            harness=plan.harness_id,
            runtime=plan.runtime_type,
            model=plan.model,
            sampling=plan.sampling,
            name=plan.agent_name,
        ),
        seat=plan.seat,
        rollout_index=rollout_index,
        attempt=attempt,
        run_id=run_id,
        episode_id=episode_id,
    )
    setup_ok = cancelled = False
    tools: RolloutTools | None = None
    try:
        # Before the box exists: a runtime whose network policy is fixed at creation must let
        # it reach the interception (a session opened later is handed this same URL).
        runtime.plan_routes([interception_url])
        # Likewise a box whose image is fixed at creation gets the agent programs built in.
        runtime.plan_tools(harness.box_tools())
        await _run_phase(trace, "boot", timeouts.boot, runtime.start, SandboxError)

        async def setup() -> None:
            await call_maybe_async(task.setup, trace, runtime)
            try:
                await harness.setup(runtime)
            except (TimeoutError, RolloutError):
                raise
            except Exception as exc:
                # Without this it would be wrapped as the task's fault.
                raise HarnessError(f"harness setup failed: {type(exc).__name__}: {exc}") from exc
            nonlocal tools
            tools = await start_tools(task, runtime)

        await _run_phase(trace, "setup", timeouts.setup, setup, TaskError)
        setup_ok = True
        trace = await _agent_phase(
            task, trace, plan, harness, runtime, broker, interception_url, timeouts, tools
        )

        async def finalize() -> None:
            await call_maybe_async(task.finalize, trace, runtime)
            await _keep_task_artifacts(task, trace, runtime)

        await _run_phase(trace, "finalize", timeouts.finalize, finalize, TaskError)
    except _PhaseFailed:
        pass
    except asyncio.CancelledError:
        cancelled = True
        trace.stop(StopCondition.CANCELLED)
        raise
    finally:
        try:
            if setup_ok and not cancelled:
                # Scoring still runs after an agent timeout or a finalize failure: the partial
                # trajectory is data. It needs the live runtime, so it precedes teardown. A
                # cancelled rollout is not scored: its caller is gone and teardown must be prompt.
                # The hooks get the deadline themselves (a late one leaves its keys None and the
                # others' values stand); the phase's own, a little later, is only a backstop.
                with contextlib.suppress(_PhaseFailed):
                    await _run_phase(
                        trace,
                        "scoring",
                        timeouts.scoring + SCORING_GRACE,
                        lambda: score_rollout(
                            task, trace, runtime, plan.scoring_overrides, timeouts.scoring
                        ),
                        TaskError,
                    )
        finally:
            if tools is not None:
                with contextlib.suppress(Exception):
                    await tools.close()
            await _teardown(trace, runtime, timeouts.teardown)
    return trace


async def _agent_phase(
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
        secret = await broker.register(
            trace,
            plan.limits,
            lambda t: check_stop(task, t, plan.scoring_overrides),
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
                await _keep_artifacts(trace, harness, runtime)
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


async def _keep_artifacts(trace: Trace, harness: Harness, runtime: Runtime) -> None:
    try:
        trace.artifacts.extend(await harness.collect_artifacts(runtime))
    except Exception as exc:  # the agent's own transcript is a bonus, never a failure
        trace.notes.append(f"harness artifacts not kept: {type(exc).__name__}: {exc}")


async def _keep_task_artifacts(task: Task[Any], trace: Trace, runtime: Runtime) -> None:
    """The files ``task.data.artifacts`` names, read from the box onto the trace."""
    for artifact in task.data.artifacts:
        try:
            raw = await runtime.read(artifact.path)
        except (SandboxError, OSError) as exc:
            if artifact.required:
                raise TaskError(f"required artifact {artifact.path} not in the box: {exc}") from exc
            continue
        trace.artifacts.append(AgentArtifact.of_bytes(artifact.path, raw))


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


async def _teardown(trace: Trace, runtime: Runtime, deadline: float) -> None:
    """Stop the runtime even when the surrounding task is being cancelled."""
    trace.start_phase("teardown")
    stop = asyncio.ensure_future(runtime.stop())
    try:
        await asyncio.wait_for(asyncio.shield(stop), timeout=deadline)
    except asyncio.CancelledError:
        # Cancelled while tearing down: finish the teardown anyway, then propagate.
        with contextlib.suppress(Exception):
            await asyncio.wait_for(stop, timeout=deadline)
        raise
    except Exception as exc:
        trace.notes.append(f"teardown failed: {type(exc).__name__}: {exc}")
    finally:
        trace.end_phase("teardown")


async def run_planned_rollout(
    task: Task[Any],
    *,
    plan: RolloutPlan,
    harness: Harness,
    runtime_options: Mapping[str, Any],
    broker: SessionBroker,
    interception_url: str,
    rollout_index: int = 0,
    attempt: int = 0,
    run_id: str | None = None,
    episode_id: str | None = None,
    model_target: Target | None = None,
) -> Trace:
    """Build the task's box from ``plan`` and run one rollout in it: the one entry point the
    in-process environment and the farm's SandboxHost share."""
    runtime = make_runtime(
        plan.runtime_type, RuntimeSpec.from_task(task.data), **dict(runtime_options)
    )
    return await execute_rollout(
        task,
        plan=plan,
        harness=harness,
        runtime=runtime,
        broker=broker,
        interception_url=interception_url,
        rollout_index=rollout_index,
        attempt=attempt,
        run_id=run_id,
        episode_id=episode_id,
        model_target=model_target,
    )
