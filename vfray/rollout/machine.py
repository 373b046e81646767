"""The per-rollout phased state machine: boot → setup → agent → finalize → scoring → teardown.

Each phase has its own deadline and timestamps in ``trace.timing``. Failures are recorded on the
trace as typed errors instead of raised, so one bad rollout never cancels its siblings; the
runtime is torn down whatever happens, cancellation included. The agent phase itself is
:mod:`vfray.rollout.agent_phase`; what a rollout runs under is :mod:`vfray.rollout.plan`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from vfray.endpoints.client import Target, rollout_target
from vfray.errors import (
    HarnessError,
    PhaseTimeoutError,
    RolloutError,
    SandboxError,
    TaskError,
)
from vfray.harnesses.base import GIT_IGNORE_PATH, Harness
from vfray.rollout.agent_phase import run_agent_phase
from vfray.rollout.plan import IMAGE_PHASE, RolloutPlan, SessionBroker
from vfray.runtimes.base import Runtime
from vfray.runtimes.registry import make_runtime, task_spec
from vfray.scoring import score_rollout
from vfray.task import Task, call_maybe_async
from vfray.tools.attach import RolloutTools, start_tools
from vfray.trace import AgentArtifact, AgentInfo, StopCondition, Trace

SCORING_GRACE = 5.0
"""Seconds past the scoring deadline before the whole phase is abandoned (only when the hooks'
own deadline could not end it, e.g. an async hook that blocks the event loop)."""


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
        if task.data.image is not None and runtime.RUNS_IMAGES:
            await _run_phase(
                trace, IMAGE_PHASE, timeouts.image, runtime.prepare_image, SandboxError
            )
        await _run_phase(trace, "boot", timeouts.boot, runtime.start, SandboxError)

        async def setup() -> None:
            await call_maybe_async(task.setup, trace, runtime)
            if harness.EXECUTES_CODE:  # the model's commands may use a repo the task set up
                await runtime.write(GIT_IGNORE_PATH, b"*\n")
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
        trace = await run_agent_phase(
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
                        lambda: _score(task, trace, harness, runtime, plan, timeouts.scoring),
                        TaskError,
                    )
        finally:
            if tools is not None:
                with contextlib.suppress(Exception):
                    await tools.close()
            await _teardown(trace, runtime, timeouts.teardown, harness)
    return trace


async def _score(
    task: Task[Any],
    trace: Trace,
    harness: Harness,
    runtime: Runtime,
    plan: RolloutPlan,
    deadline: float,
) -> None:
    """The task's rewards and metrics, then the harness's own metrics (``Harness.score``)."""
    await score_rollout(task, trace, runtime, plan.scoring_overrides, deadline)
    try:
        added = await asyncio.wait_for(harness.score(trace, runtime), deadline)
    except Exception as exc:  # the harness's metrics are extra: the task's scores stand
        trace.notes.append(f"harness score failed: {type(exc).__name__}: {exc}")
        return
    for name, value in added.items():
        trace.metrics.setdefault(name, None if value is None else float(value))


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


async def _teardown(
    trace: Trace, runtime: Runtime, deadline: float, harness: Harness | None = None
) -> None:
    """The harness's cleanup (a failure is a note), then stop the runtime, even when the
    surrounding task is being cancelled."""
    trace.start_phase("teardown")
    cancelled = False
    if harness is not None:
        try:
            await asyncio.wait_for(harness.cleanup(runtime), deadline)
        except asyncio.CancelledError:
            cancelled = True  # the box is stopped all the same, then the cancel goes on
        except Exception as exc:
            trace.notes.append(f"harness cleanup failed: {type(exc).__name__}: {exc}")
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
    if cancelled:
        raise asyncio.CancelledError


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
    runtime = make_runtime(plan.runtime_type, task_spec(task.data), **dict(runtime_options))
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
