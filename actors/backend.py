"""The Ray backend of the run driver (:mod:`vfray.run.driver`): rollouts run in SandboxHost actors,
each task's group is scored in a host (an episode Ray task when the host is lost), and rows go
to the TraceSink actor.

Only small :class:`~vfray.run.outcomes.RolloutOutcome` objects travel back to the driver; traces go
from the hosts to the scoring host to the TraceSink by ObjectRef, so the driver's memory stays
flat however long the run. The backend keeps each row's ObjectRef until the sink reports it
durable, and re-sends those to the sink after Ray restarts it.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Sequence
from typing import Any, cast

import ray
from ray import exceptions as rex

from actors.episode import run_episode
from vfray.errors import SinkError
from vfray.run.hosts import HostLost
from vfray.run.outcomes import EpisodeJob, EpisodeOutcome, RolloutJob, RolloutOutcome
from vfray.run.placement import Placement
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

SINK_LOST: tuple[type[BaseException], ...] = (rex.RayActorError, rex.ActorUnavailableError)
"""The TraceSink actor died or is restarting: re-send what it had not made durable."""

SINK_RESTART_S = 120.0
"""How long to wait for Ray to bring a dead TraceSink back before the run fails."""

log = logging.getLogger(__name__)


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
        placement: Placement | None = None,
    ) -> None:
        if not hosts:
            raise ValueError("the Ray backend needs at least one SandboxHost")
        self.hosts = list(hosts)
        self.num_hosts = len(self.hosts)
        self.sink = sink
        self.placement = placement
        """Host ``i``'s node and its resources: where a task's rollouts may go (None: any)."""
        # Rows sent to the sink but not yet reported on disk, by key: (method, ObjectRef).
        self._unacked: dict[str, tuple[str, Any]] = {}
        self._recovering = asyncio.Lock()
        self._episodes = 0

    async def rollout(self, host: int, job: RolloutJob) -> tuple[RolloutOutcome, Any]:
        outcome_ref, trace_ref = self.hosts[host].run_rollout.options(num_returns=2).remote(job)
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
        await self._send("append_trace", handle, uuid.uuid4().hex)

    async def _send(self, method: str, ref: Any, key: str) -> None:
        self._unacked[key] = (method, ref)
        try:
            self._acked(await _sink_call(getattr(self.sink, method).remote(ref, key)))
        except SINK_LOST as exc:
            await self._recover(exc)
        except asyncio.CancelledError:
            # The run is being cancelled (Farm.close, Ctrl-C): the sink writes what it was
            # sent; rows it never gets (an episode cancelled with the run) are re-run by
            # `vfray resume`, so they are not a write failure to report at close.
            self._unacked.pop(key, None)
            raise

    def _acked(self, keys: list[str]) -> None:
        for key in keys:
            self._unacked.pop(key, None)

    async def _recover(self, exc: BaseException) -> None:
        """Wait for Ray to restart the sink, then re-send every row it did not report durable
        (the restarted sink skips rows its predecessor wrote, and keys it has seen)."""
        async with self._recovering:
            log.warning("the TraceSink died (%s); re-sending %d appends", exc, len(self._unacked))
            deadline = time.monotonic() + SINK_RESTART_S
            while True:
                try:
                    for key, (method, ref) in list(self._unacked.items()):
                        self._acked(await _sink_call(getattr(self.sink, method).remote(ref, key)))
                    return
                except SINK_LOST as again:
                    if time.monotonic() > deadline:
                        raise SinkError(
                            f"the TraceSink actor died and did not come back "
                            f"({type(again).__name__}); {len(self._unacked)} appends may be "
                            "unwritten: run `vfray resume` on the run folder"
                        ) from again
                    await asyncio.sleep(0.5)

    async def close(self) -> None:
        """Make every row durable, then let the sink compact. A sink that dies while
        compacting (every row is already in its parts) does not fail the run: the folder is
        readable as it is, and the next resume finishes the compaction."""
        for _ in range(3):
            try:
                self._acked(await _sink_call(self.sink.flush.remote()))
                break
            except SINK_LOST as exc:
                await self._recover(exc)  # raises SinkError when the sink stays dead
        if self._unacked:
            raise SinkError(f"{len(self._unacked)} appends were never written by the TraceSink")
        deadline = time.monotonic() + SINK_RESTART_S
        while True:
            try:
                await _sink_call(self.sink.close.remote())
                return
            except SINK_LOST as exc:
                if time.monotonic() > deadline:
                    log.warning(
                        "the TraceSink died while compacting and did not come back (%s); every "
                        "row is in the parts, and the next resume compacts them",
                        exc,
                    )
                    return
                log.warning("the TraceSink died while closing (%s); retrying", exc)
                await asyncio.sleep(0.5)

    async def finish(self, job: EpisodeJob, handles: list[Any]) -> EpisodeOutcome:
        # Scored in a host (round-robin), not in a Ray task: a task per episode kept Ray
        # starting and killing worker processes (each importing vfray and pyarrow) as bursts
        # of episodes came and went. A host lost meanwhile: a Ray task (retried by Ray) does it.
        host = self.hosts[self._episodes % self.num_hosts]
        self._episodes += 1
        outcome_ref, rows_ref = host.finish_episode.options(num_returns=2).remote(job, *handles)
        try:
            outcome: EpisodeOutcome = await outcome_ref
        except INFRA_ERRORS as exc:
            if _is_cancellation(exc):
                raise asyncio.CancelledError(f"episode cancelled: {exc}") from exc
            log.warning("scoring an episode on a host failed (%s); scoring it on a Ray task", exc)
            # num_returns=2: two refs, which Ray's typing of .remote() does not model.
            outcome_ref, rows_ref = cast("list[Any]", run_episode.remote(job, *handles))
            outcome = await outcome_ref
        # The sink resolves the rows itself; the driver never deserializes them.
        await self._send("append_rows", rows_ref, job.episode_id)
        return outcome

    def unfit(self, task: Task[Any]) -> str | None:
        return self.placement.unfit(task.data.resources) if self.placement is not None else None


async def _sink_call(ref: Any) -> Any:
    """Await a sink call; a :class:`SinkError` raised in the actor comes back as itself (one
    line for the user), not wrapped in Ray's traceback."""
    try:
        return await ref
    except rex.RayTaskError as exc:
        if isinstance(exc.cause, SinkError):
            raise exc.cause from None
        raise
