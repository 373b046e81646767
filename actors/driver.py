"""The run driver: iterates the taskset lazily, keeps at most ``max_concurrent`` rollouts in
flight over a pool of SandboxHosts, retries rollouts whose host or node died, and hands each
task's finished rollouts to an episode Ray task.

Only small :class:`~actors.episode.RolloutOutcome` objects travel back to the driver; traces go
from the hosts to the episode tasks to the TraceSink by reference, so the driver's memory stays
flat however long the run.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import ray
from ray import exceptions as rex

from actors.episode import EpisodeOutcome, RolloutOutcome, run_episode
from vfray.errors import InfrastructureError, SandboxError
from vfray.task import Task
from vfray.trace import AgentInfo, StopCondition, Trace, new_id
from vfray.traces.convert import traces_to_table

log = logging.getLogger(__name__)

INFRA_ERRORS: tuple[type[BaseException], ...] = (
    rex.RayActorError,
    rex.ActorUnavailableError,
    rex.ObjectLostError,
    rex.WorkerCrashedError,
    rex.OwnerDiedError,
    rex.RayTaskError,
)
"""Failures of the machinery under a rollout, not of the rollout: these are retried."""


RETRYABLE = frozenset({"ProviderError", "InterceptionError", "InfrastructureError"})
"""Rollout error types that say nothing about the task or the policy: retried."""


def _is_cancellation(exc: BaseException) -> bool:
    if isinstance(exc, rex.TaskCancelledError):
        return True
    cause = getattr(exc, "cause", None)
    return isinstance(exc, rex.RayTaskError) and isinstance(
        cause, (rex.TaskCancelledError, asyncio.CancelledError)
    )


class HostPool:
    """The SandboxHost actors of a run, picked least-loaded first."""

    def __init__(self, hosts: Sequence[Any]) -> None:
        if not hosts:
            raise ValueError("a HostPool needs at least one host")
        self.hosts = list(hosts)
        self.load = [0] * len(self.hosts)

    def acquire(self, avoid: int | None = None) -> int:
        order = sorted(range(len(self.hosts)), key=lambda i: (i == avoid, self.load[i]))
        index = order[0]
        self.load[index] += 1
        return index

    def release(self, index: int) -> None:
        self.load[index] -= 1


@dataclass
class ResumeState:
    """What an earlier run already holds for one task: finished traces by rollout index, the
    episode id, and the next attempt number per rollout index."""

    episode_id: str
    done: dict[int, Trace] = field(default_factory=dict)
    next_attempt: dict[int, int] = field(default_factory=dict)


@dataclass
class RunPlan:
    run_id: str
    rollouts_per_task: int
    max_concurrent: int
    max_retries: int = 2
    scoring_overrides: dict[str, str] = field(default_factory=dict)
    agent: AgentInfo = field(default_factory=AgentInfo)
    keep_episodes: bool = False
    max_groups_in_flight: int | None = None
    """Bound on groups started but not yet delivered to ``on_episode`` (streaming: bounds how
    stale a trainer's groups can be); None means only ``max_concurrent`` rollouts bound."""


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
        if outcome.reward is not None:
            self.reward_sum += outcome.reward
            self.rewarded += 1


class RunDriver:
    """Drives one run over a host pool; ``on_episode`` sees every finished episode."""

    def __init__(
        self,
        plan: RunPlan,
        pool: HostPool,
        sink: Any,
        on_episode: Callable[[EpisodeOutcome], Awaitable[None]] | None = None,
        resume: dict[str, ResumeState] | None = None,
        unfit: Callable[[Task[Any]], str | None] | None = None,
    ) -> None:
        self.plan = plan
        self.pool = pool
        self.sink = sink
        self.on_episode = on_episode
        self.resume = resume or {}
        self.unfit = unfit
        self.progress = Progress()
        self._window = asyncio.Semaphore(plan.max_concurrent)
        self._groups = (
            asyncio.Semaphore(plan.max_groups_in_flight) if plan.max_groups_in_flight else None
        )
        self._episodes: set[asyncio.Task[None]] = set()
        self._failure: BaseException | None = None

    async def run(self, tasks: Iterable[Task[Any]]) -> Progress:
        """Submit every task's rollouts, bounded by the window; returns when all are written."""
        try:
            for task in tasks:
                if self._failure is not None:
                    break
                await self._start_episode(task)
            while self._episodes:
                await asyncio.wait(set(self._episodes))
        except BaseException:
            for job in self._episodes:
                job.cancel()
            await asyncio.gather(*self._episodes, return_exceptions=True)
            raise
        if self._failure is not None:
            raise self._failure
        return self.progress

    async def _start_episode(self, task: Task[Any]) -> None:
        n = self.plan.rollouts_per_task
        state = self.resume.get(task.key) or ResumeState(episode_id=new_id())
        todo = [i for i in range(n) if i not in state.done]
        if not todo:
            return
        if self._groups is not None:
            await self._groups.acquire()
        rollouts: list[asyncio.Task[Any]] = []
        reason = self.unfit(task) if self.unfit is not None else None
        for index in todo:
            await self._window.acquire()
            self.progress.submitted += 1
            attempt = state.next_attempt.get(index, 0)
            if reason is not None:
                rollouts.append(
                    asyncio.ensure_future(
                        self._refuse(task, index, attempt, state.episode_id, reason)
                    )
                )
                continue
            rollouts.append(
                asyncio.ensure_future(self._rollout(task, index, attempt, state.episode_id))
            )
        job = asyncio.ensure_future(self._finish(task, state, rollouts))
        self._episodes.add(job)
        job.add_done_callback(self._episode_done)

    def _episode_done(self, job: asyncio.Task[None]) -> None:
        self._episodes.discard(job)
        if self._groups is not None:
            self._groups.release()
        if self._failure is not None:
            return
        if job.cancelled():
            # A host cancelled its rollouts (Farm.close, the job stopped): the run is over.
            self._failure = asyncio.CancelledError("the run was cancelled")
        elif job.exception() is not None:
            self._failure = job.exception()

    async def _rollout(self, task: Task[Any], index: int, attempt: int, episode_id: str) -> Any:
        """Run one rollout, retrying on another host when the machinery under it fails.
        Returns the ObjectRef of the final trace."""
        avoid: int | None = None
        try:
            while True:
                host_index = self.pool.acquire(avoid)
                host = self.pool.hosts[host_index]
                try:
                    outcome_ref, trace_ref = host.run_rollout.options(num_returns=2).remote(
                        task, index, attempt, self.plan.run_id, episode_id
                    )
                    try:
                        outcome: RolloutOutcome = await outcome_ref
                    except asyncio.CancelledError:
                        # Cancel the actor-side coroutine too: it tears its sandbox down.
                        ray.cancel(outcome_ref)
                        raise
                    if outcome.error_type in RETRYABLE and attempt < self.plan.max_retries:
                        # The model endpoint or the interception failed, not the task: keep
                        # the attempt as a row and run the rollout again.
                        log.warning(
                            "rollout %s/%d attempt %d failed with %s; retrying",
                            task.key[:12],
                            index,
                            attempt,
                            outcome.error_type,
                        )
                        await self.sink.append_trace.remote(trace_ref)
                        self.progress.retried += 1
                        attempt += 1
                        avoid = host_index
                        continue
                    self.progress.record(outcome)
                    return trace_ref
                except INFRA_ERRORS as exc:
                    if _is_cancellation(exc):
                        # The host cancelled it (Farm.close, ray job stop): end the run, do
                        # not retry.
                        raise asyncio.CancelledError(f"rollout cancelled: {exc}") from exc
                    failed = self._infra_trace(task, index, attempt, episode_id, exc)
                    if attempt >= self.plan.max_retries:
                        self.progress.record(RolloutOutcome.of(failed))
                        return ray.put(failed)
                    log.warning(
                        "rollout %s/%d attempt %d lost (%s); retrying",
                        task.key[:12],
                        index,
                        attempt,
                        type(exc).__name__,
                    )
                    # The lost attempt stays in the run as its own row.
                    await self.sink.append.remote(traces_to_table([failed]))
                    self.progress.retried += 1
                    attempt += 1
                    avoid = host_index
                finally:
                    self.pool.release(host_index)
        finally:
            self._window.release()

    async def _refuse(
        self, task: Task[Any], index: int, attempt: int, episode_id: str, reason: str
    ) -> Any:
        """A rollout no node can host fails at once, as data, instead of waiting forever."""
        try:
            trace = self._infra_trace(task, index, attempt, episode_id, None)
            trace.errors.clear()
            trace.add_error(SandboxError(reason), "placement")
            self.progress.record(RolloutOutcome.of(trace))
            return ray.put(trace)
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
        first_line = str(exc).splitlines()[0] if str(exc) else ""
        message = f"{type(exc).__name__}: {first_line}"
        trace.add_error(InfrastructureError(message), "host")
        trace.stop(StopCondition.ERROR)
        return trace

    async def _finish(
        self, task: Task[Any], state: ResumeState, rollouts: list[asyncio.Task[Any]]
    ) -> None:
        try:
            refs = await asyncio.gather(*rollouts)
        except BaseException:
            for r in rollouts:
                r.cancel()
            raise
        outcome_ref, rows_ref = run_episode.remote(
            task,
            self.plan.run_id,
            state.episode_id,
            self.plan.scoring_overrides,
            self.plan.keep_episodes,
            list(state.done.values()),
            *refs,
        )
        # The sink resolves the rows itself; the driver never deserializes them.
        await self.sink.append_rows.remote(rows_ref, state.episode_id)
        outcome: EpisodeOutcome = await outcome_ref
        self.progress.episodes += 1
        if self.on_episode is not None:
            await self.on_episode(outcome)
