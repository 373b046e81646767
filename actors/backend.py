"""The Ray backend of the run driver (:mod:`vfray.driver`): rollouts run in SandboxHost actors,
each task's group is scored by an episode Ray task, and rows go to the TraceSink actor.

Only small :class:`~vfray.outcomes.RolloutOutcome` objects travel back to the driver; traces go
from the hosts to the episode tasks to the TraceSink by ObjectRef, so the driver's memory stays
flat however long the run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import ray
from ray import exceptions as rex

from actors.episode import run_episode
from vfray.driver import HostLost
from vfray.outcomes import EpisodeOutcome, EpisodeSpec, RolloutOutcome
from vfray.task import Task
from vfray.trace import Trace

INFRA_ERRORS: tuple[type[BaseException], ...] = (
    rex.RayActorError,
    rex.ActorUnavailableError,
    rex.ObjectLostError,
    rex.WorkerCrashedError,
    rex.OwnerDiedError,
    rex.RayTaskError,
)
"""Failures of the machinery under a rollout, not of the rollout: these are retried."""


def _is_cancellation(exc: BaseException) -> bool:
    if isinstance(exc, rex.TaskCancelledError):
        return True
    cause = getattr(exc, "cause", None)
    return isinstance(exc, rex.RayTaskError) and isinstance(
        cause, (rex.TaskCancelledError, asyncio.CancelledError)
    )


class RayBackend:
    """SandboxHost actors, episode tasks and a TraceSink actor; handles are ObjectRefs."""

    def __init__(
        self,
        hosts: Sequence[Any],
        sink: Any,
        unfit: Callable[[Task[Any]], str | None] | None = None,
    ) -> None:
        if not hosts:
            raise ValueError("the Ray backend needs at least one SandboxHost")
        self.hosts = list(hosts)
        self.num_hosts = len(self.hosts)
        self.sink = sink
        self._unfit = unfit

    async def rollout(
        self, host: int, task: Task[Any], index: int, attempt: int, run_id: str, episode_id: str
    ) -> tuple[RolloutOutcome, Any]:
        outcome_ref, trace_ref = (
            self.hosts[host]
            .run_rollout.options(num_returns=2)
            .remote(task, index, attempt, run_id, episode_id)
        )
        try:
            outcome: RolloutOutcome = await outcome_ref
        except asyncio.CancelledError:
            # Cancel the actor-side coroutine too: it tears its sandbox down.
            ray.cancel(outcome_ref)
            raise
        except INFRA_ERRORS as exc:
            if _is_cancellation(exc):
                # The host cancelled it (Farm.close, ray job stop): end the run, do not retry.
                raise asyncio.CancelledError(f"rollout cancelled: {exc}") from exc
            first_line = str(exc).splitlines()[0] if str(exc) else ""
            raise HostLost(f"{type(exc).__name__}: {first_line}") from exc
        return outcome, trace_ref

    def hold(self, trace: Trace) -> Any:
        return ray.put(trace)

    async def keep_attempt(self, handle: Any) -> None:
        await self.sink.append_trace.remote(handle)

    async def finish(
        self,
        task: Task[Any],
        episode_id: str,
        spec: EpisodeSpec,
        previous: list[Trace],
        handles: list[Any],
    ) -> EpisodeOutcome:
        outcome_ref, rows_ref = run_episode.remote(task, episode_id, spec, previous, *handles)
        # The sink resolves the rows itself; the driver never deserializes them.
        await self.sink.append_rows.remote(rows_ref, episode_id)
        outcome: EpisodeOutcome = await outcome_ref
        return outcome

    def unfit(self, task: Task[Any]) -> str | None:
        return self._unfit(task) if self._unfit is not None else None
