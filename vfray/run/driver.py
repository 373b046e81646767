"""The run driver: iterates the taskset lazily, keeps at most ``max_concurrent`` rollouts in
flight, retries rollouts whose machinery or model endpoint failed (the latter after a backoff,
holding new starts while the endpoint is down: :mod:`vfray.endpoints.retry`), and hands each task's
finished rollouts to the backend to be scored and written.

The driver knows nothing about Ray. A :class:`RunBackend` runs the rollouts and episodes: the Ray
one (``actors.backend``) over SandboxHost actors, episode tasks and a TraceSink actor, passing
traces by reference so the driver's memory stays flat; the local one
(:mod:`vfray.run.local`) in this process.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from vfray.endpoints.retry import EndpointCircuit
from vfray.errors import (
    ConfigError,
    InfrastructureError,
    ProviderError,
    TasksetError,
    VfrayError,
)
from vfray.run.hosts import HOST_LOST_BACKOFF_S, HostLost, HostPool
from vfray.run.outcomes import (
    EpisodeJob,
    EpisodeOutcome,
    RolloutJob,
    RolloutOutcome,
)
from vfray.run.placement import Placement
from vfray.run.plan import ResumeState, RunPlan
from vfray.task import Task
from vfray.trace import StopCondition, Trace, new_id

log = logging.getLogger(__name__)

RETRYABLE = frozenset({"InterceptionError", "InfrastructureError"})
"""Rollout error types that say nothing about the task or the policy: retried at once, up to
``max_retries``. A ``ProviderError`` is retried too, after a backoff, under the run's
:class:`~vfray.endpoints.retry.RetryPolicy`."""


class RunBackend(Protocol):
    """Where rollouts run and rows go. ``Handle`` values are opaque to the driver: a trace, or
    a reference to one."""

    num_hosts: int
    placement: Placement | None
    """Which hosts' nodes fit a task, and the GPUs their rollouts hold (None: any host)."""

    async def rollout(self, host: int, job: RolloutJob) -> tuple[RolloutOutcome, Any]:
        """Run one rollout on ``host``; returns its outcome and a handle to its trace.
        Raises :class:`~vfray.run.hosts.HostLost` when the host failed under it, CancelledError
        when the host cancelled it."""
        ...

    def hold(self, trace: Trace) -> Any:
        """A handle for a trace the driver made itself (a lost or refused rollout)."""
        ...

    async def keep_attempt(self, handle: Any) -> None:
        """Write the row of an attempt that is about to be retried."""
        ...

    async def finish(self, job: EpisodeJob, handles: list[Any]) -> EpisodeOutcome:
        """Score the group and write its rows; returns the episode's outcome."""
        ...

    def unfit(self, task: Task[Any]) -> str | None:
        """Why no node could ever fit ``task``'s resources (None when one can): the run is then
        refused in one line."""
        ...


@dataclass
class Progress:
    """Counters the driver updates; the progress display reads them."""

    submitted: int = 0
    done: int = 0
    errored: int = 0
    retried: int = 0
    episodes: int = 0
    reward_sum: float = 0.0
    rewarded: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    endpoint_down_since: float | None = None
    """Wall-clock time since which the model endpoint is judged down and new rollouts wait
    (None while it is up)."""
    last_upstream_error: str | None = None
    """The last model call error a finished rollout attempt reported (``HTTP 500: boom``)."""

    @property
    def in_flight(self) -> int:
        return self.submitted - self.done

    @property
    def mean_reward(self) -> float | None:
        return self.reward_sum / self.rewarded if self.rewarded else None

    def record(self, outcome: RolloutOutcome) -> None:
        self.done += 1
        if not outcome.ok:
            self.errored += 1
            key = outcome.error_type or "unknown"
            self.errors[key] = self.errors.get(key, 0) + 1

    def scored(self, episode: EpisodeOutcome) -> None:
        """Count the group's final rewards (group rewards included), once its episode is
        scored: the progress line then shows the same mean as the results table."""
        for outcome in episode.rollouts:
            if outcome.reward is not None:
                self.reward_sum += outcome.reward
                self.rewarded += 1


class RunDriver:
    """Drives one run over a backend; ``on_episode`` sees every finished episode.

    ``on_rollout`` sees each rollout attempt's outcome as soon as it is back; an exception it
    raises ends the run at once: every rollout in flight is cancelled (its box torn down), no
    further group is scored or delivered, and :meth:`run` raises that exception."""

    def __init__(
        self,
        plan: RunPlan,
        backend: RunBackend,
        on_episode: Callable[[EpisodeOutcome], Awaitable[None]] | None = None,
        resume: dict[str, ResumeState] | None = None,
        on_rollout: Callable[[RolloutOutcome], None] | None = None,
    ) -> None:
        self.plan = plan
        self.backend = backend
        self.pool = HostPool(backend.num_hosts)
        self.on_episode = on_episode
        self.on_rollout = on_rollout
        self._stopped: BaseException | None = None
        self._runner: asyncio.Task[Any] | None = None
        self.resume = resume or {}
        self.progress = Progress()
        self._window = asyncio.Semaphore(plan.max_concurrent)
        self._groups = (
            asyncio.Semaphore(plan.max_groups_in_flight) if plan.max_groups_in_flight else None
        )
        self._spec = plan.episode_spec()
        self.circuit = EndpointCircuit(plan.retry)
        self._episodes: set[asyncio.Task[None]] = set()
        self._failure: BaseException | None = None
        self._tasks_seen = 0

    async def run(self, tasks: Iterable[Task[Any]]) -> Progress:
        """Submit every task's rollouts, bounded by the window; returns when all are written.

        When the task source fails mid-run, the rollouts already started still finish and are
        written; then the run raises one :class:`TasksetError` saying what failed."""
        self._runner = asyncio.current_task()
        try:
            source = iter(tasks)
            while self._failure is None:
                task = self._next_task(source)
                if task is None:
                    break
                await self._start_episode(task)
            while self._episodes:
                await asyncio.wait(set(self._episodes))
        except BaseException as exc:
            for job in self._episodes:
                job.cancel()
            await asyncio.gather(*self._episodes, return_exceptions=True)
            if self._stopped is not None and isinstance(exc, asyncio.CancelledError):
                # The cancellation was _stop's own: the caller sees why the run stopped.
                if self._runner is not None:
                    self._runner.uncancel()
                raise self._stopped from None
            raise
        if self._failure is not None:
            raise self._failure
        return self.progress

    def _next_task(self, source: Iterator[Task[Any]]) -> Task[Any] | None:
        """The next task, None at the end; a failing source ends the run's submissions and is
        kept as the run's failure (raised once the started rollouts are written)."""
        try:
            return next(source)
        except StopIteration:
            return None
        except VfrayError as exc:  # already says what is wrong (a duplicate key, a bad config)
            self._failure = exc
        except Exception as exc:
            failure = TasksetError(
                f"the taskset failed after {self._tasks_seen} tasks: {type(exc).__name__}: "
                f"{exc} (the rollouts already started were finished and written)"
            )
            failure.__cause__ = exc
            self._failure = failure
        log.warning(
            "no new tasks (%s); finishing the %d rollouts in flight",
            self._failure,
            self.progress.in_flight,
        )
        return None

    async def _start_episode(self, task: Task[Any]) -> None:
        self._tasks_seen += 1
        n = self.plan.rollouts_per_task
        state = self.resume.get(task.key) or ResumeState(episode_id=new_id())
        todo = [i for i in range(n) if i not in state.done and i not in state.games]
        if not todo and not state.rescore:
            return
        reason = self.backend.unfit(task)
        if reason is not None:
            # No node of the cluster can ever fit it: bad input, refused in one line before any
            # of its rollouts runs (the ones other tasks started finish and are written).
            self._failure = ConfigError(f"task {task.key[:16]}: {reason}")
            return
        if self._groups is not None:
            await self._groups.acquire()
        rollouts: list[asyncio.Task[Any]] = []
        for index in todo:
            await self._window.acquire()
            self.progress.submitted += 1
            attempt = state.next_attempt.get(index, 0)
            job = self._rollout(task, index, attempt, state.episode_id)
            rollouts.append(asyncio.ensure_future(job))
        finisher = asyncio.ensure_future(self._finish(task, state, rollouts))
        self._episodes.add(finisher)
        finisher.add_done_callback(self._episode_done)

    def _stop(self, reason: BaseException) -> None:
        """End the run now (``on_rollout`` refused an outcome): cancel the loop in :meth:`run`,
        which cancels every episode and then raises ``reason``."""
        if self._stopped is not None:
            return
        self._stopped = reason
        if self._runner is not None and not self._runner.done():
            self._runner.cancel()

    def _episode_done(self, job: asyncio.Task[None]) -> None:
        self._episodes.discard(job)
        if self._groups is not None:
            self._groups.release()
        # Retrieve the outcome even when the run already failed, so a second episode's failure
        # (the same full disk, say) is not reported again by asyncio as "never retrieved".
        failure = (
            asyncio.CancelledError("the run was cancelled") if job.cancelled() else job.exception()
        )
        if self._failure is None and failure is not None:
            # A host cancelled its rollouts (Farm.close, the job stopped): the run is over.
            self._failure = failure

    async def _place(self, task: Task[Any], avoid: int | None) -> int:
        """The host for a rollout of ``task``: the least loaded among those whose node fits its
        resources and has its GPUs free (waiting for them), held until the rollout ends."""
        placement = self.backend.placement
        if placement is None:
            return self.pool.acquire(avoid)
        return await placement.acquire(
            task.data.resources, lambda free: self.pool.acquire(avoid, among=free)
        )

    async def _rollout(self, task: Task[Any], index: int, attempt: int, episode_id: str) -> Any:
        """Run one rollout, retrying it when the machinery under it failed (at once, on another
        host) or the model endpoint did (after a backoff, and while the endpoint circuit lets
        rollouts through). Returns the backend's handle to the final trace."""
        avoid: int | None = None
        provider_retries = 0
        try:
            while True:
                probe = await self.circuit.admit()
                try:
                    host = await self._place(task, avoid)
                except BaseException:
                    self.circuit.abandon(probe)
                    raise
                told = provider = outage = lost = False
                try:
                    job = RolloutJob(
                        task=task,
                        index=index,
                        attempt=attempt,
                        run_id=self.plan.run_id,
                        episode_id=episode_id,
                    )
                    outcome, handle = await self.backend.rollout(host, job)
                    self.pool.answered(host)
                    # A refusal (a 4xx) is this rollout's own error: the endpoint is up.
                    provider = (
                        outcome.error_type == ProviderError.__name__
                        and not outcome.endpoint_refused
                    )
                    self.circuit.record(provider, probe, task.key)
                    told = True
                    self.progress.endpoint_down_since = self.circuit.down_since
                    if outcome.upstream_error is not None:
                        self.progress.last_upstream_error = outcome.upstream_error
                    if self.on_rollout is not None:
                        try:
                            self.on_rollout(outcome)
                        except Exception as exc:
                            self._stop(exc)
                            # This rollout fails too, so its group is neither scored nor
                            # delivered before the cancellation reaches it.
                            raise
                    if provider and self.circuit.poisoned(task.key):
                        # Its task's request failed K times in a row with nobody else failing:
                        # the request is poisoned, not the endpoint down, and another try gets
                        # the same answer. The group arrives now, with its errors.
                        log.warning(
                            "rollout %s/%d attempt %d failed with %s; not retrying: the "
                            "endpoint fails this task's request and answers others",
                            task.key[:12],
                            index,
                            attempt,
                            outcome.error_type,
                        )
                        retry = False
                    elif provider:
                        # While the endpoint is judged down the failure is the outage's, not
                        # this rollout's: it waits for the endpoint without spending its budget
                        # (max_outage bounds that wait).
                        outage = self.circuit.holding
                        retry = outage or provider_retries < self.plan.retry.provider_retries
                    else:
                        retry = outcome.error_type in RETRYABLE and attempt < self.plan.max_retries
                    if not retry:
                        self.progress.record(outcome)
                        return handle
                    # The model endpoint or the interception failed, not the task: keep the
                    # attempt as a row and run the rollout again.
                    log.warning(
                        "rollout %s/%d attempt %d failed with %s; retrying",
                        task.key[:12],
                        index,
                        attempt,
                        outcome.error_type,
                    )
                    await self.backend.keep_attempt(handle)
                except HostLost as exc:
                    self.pool.lost(host)
                    lost = True
                    failed = self._infra_trace(task, index, attempt, episode_id, exc)
                    if attempt >= self.plan.max_retries:
                        self.progress.record(RolloutOutcome.of(failed))
                        return self.backend.hold(failed)
                    log.warning(
                        "rollout %s/%d attempt %d lost (%s); retrying",
                        task.key[:12],
                        index,
                        attempt,
                        exc,
                    )
                    # The lost attempt stays in the run as its own row.
                    await self.backend.keep_attempt(self.backend.hold(failed))
                finally:
                    self.pool.release(host)
                    if self.backend.placement is not None:
                        await self.backend.placement.release(host, task.data.resources)
                    if not told:
                        self.circuit.abandon(probe)
                self.progress.retried += 1
                attempt += 1
                avoid = host
                if lost:
                    await asyncio.sleep(HOST_LOST_BACKOFF_S * attempt)
                if provider:
                    if not outage:
                        provider_retries += 1
                    await asyncio.sleep(self.plan.retry.delay(max(1, provider_retries)))
        finally:
            self._window.release()

    def _infra_trace(
        self,
        task: Task[Any],
        index: int,
        attempt: int,
        episode_id: str,
        exc: BaseException | None,
    ) -> Trace:
        trace = Trace(
            task=task.record(),
            agent=self.plan.agent,
            rollout_index=index,
            attempt=attempt,
            run_id=self.plan.run_id,
            episode_id=episode_id,
        )
        trace.add_error(InfrastructureError(str(exc) if exc is not None else ""), "host")
        trace.stop(StopCondition.ERROR)
        return trace

    async def _finish(
        self, task: Task[Any], state: ResumeState, rollouts: list[asyncio.Task[Any]]
    ) -> None:
        try:
            handles = await asyncio.gather(*rollouts)
        except BaseException:
            for r in rollouts:
                r.cancel()
            # Wait for them: a cancelled rollout is still tearing its sandbox down.
            await asyncio.gather(*rollouts, return_exceptions=True)
            raise
        job = EpisodeJob(
            task=task,
            episode_id=state.episode_id,
            spec=self._spec,
            previous=state.finished(),
        )
        outcome = await self.backend.finish(job, list(handles))
        self.progress.episodes += 1
        self.progress.scored(outcome)
        if self.on_episode is not None:
            await self.on_episode(outcome)
