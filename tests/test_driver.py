"""The run driver's own logic without Ray: the in-flight window, retries (at once for
interception failures, after a short wait on another host for lost hosts, after a backoff for
provider failures), a lost host picked last while Ray restarts it, the endpoint circuit, resume,
cancellation, a failing task source, and how stale streamed groups can get.

The backend here is a small in-memory implementation of the driver's backend protocol whose
rollouts are scripted per (task, index, attempt); everything it hands the driver is a real
Trace, and episodes are finished by the real ``finish_episode``."""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

import vfray as vf
from vfray.endpoints.retry import EndpointCircuit, RetryPolicy
from vfray.errors import ROLLOUT_ERROR_TYPES, ConfigError, SinkError
from vfray.run import hosts as run_hosts
from vfray.run.driver import RunDriver
from vfray.run.hosts import HostLost, HostPool
from vfray.run.outcomes import (
    EpisodeJob,
    EpisodeOutcome,
    RolloutJob,
    RolloutOutcome,
    finish_episode,
)
from vfray.run.placement import Placement
from vfray.run.plan import ResumeState, RunPlan
from vfray.trace import RewardRecord, StopCondition, Trace


class Scored(vf.Task[vf.TaskData]):
    @vf.reward
    def one(self) -> float:
        return 1.0


def tasks(count: int) -> list[Scored]:
    return [Scored(vf.TaskData(prompt=f"task {i}"), key=f"t{i}") for i in range(count)]


Step = str | None | BaseException
"""What one scripted rollout attempt does: succeed (None), fail with a rollout error type by
name, or raise (HostLost, CancelledError)."""


@dataclass
class Call:
    key: str
    index: int
    attempt: int
    host: int
    episode_id: str
    started: float


@dataclass
class FakeBackend:
    """The driver's backend protocol in memory; ``script`` decides each attempt."""

    script: Callable[[str, int, int], Step] = lambda key, index, attempt: None
    num_hosts: int = 2
    latency: float = 0.01
    unfit_keys: set[str] = field(default_factory=set)
    placement: Placement | None = None
    calls: list[Call] = field(default_factory=list)
    kept: list[Trace] = field(default_factory=list)
    finished: list[tuple[str, list[int], list[int]]] = field(default_factory=list)
    in_flight: int = 0
    peak: int = 0

    async def rollout(self, host: int, job: RolloutJob) -> tuple[RolloutOutcome, Any]:
        task, index, attempt, episode_id = job.task, job.index, job.attempt, job.episode_id
        assert episode_id is not None
        self.calls.append(Call(task.key, index, attempt, host, episode_id, time.monotonic()))
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            await asyncio.sleep(self.latency)
            step = self.script(task.key, index, attempt)
            if isinstance(step, BaseException):
                raise step
            trace = Trace(
                task=task.record(),
                rollout_index=index,
                attempt=attempt,
                run_id=job.run_id,
                episode_id=episode_id,
            )
            if step is None:
                trace.rewards["one"] = RewardRecord(value=1.0)
                trace.stop(StopCondition.COMPLETED)
            else:
                trace.add_error(ROLLOUT_ERROR_TYPES[step]("scripted failure"), "agent")
                trace.stop(StopCondition.ERROR)
            return RolloutOutcome.of(trace), trace
        finally:
            self.in_flight -= 1

    def hold(self, trace: Trace) -> Any:
        return trace

    async def keep_attempt(self, handle: Any) -> None:
        self.kept.append(handle)

    async def finish(self, job: EpisodeJob, handles: list[Any]) -> EpisodeOutcome:
        outcome, _rows = await finish_episode(job, handles)
        self.finished.append(
            (job.task.key, [t.rollout_index for t in job.previous], [t.attempt for t in handles])
        )
        return outcome

    def unfit(self, task: Any) -> str | None:
        return "needs a GPU nobody has" if task.key in self.unfit_keys else None


FAST = RetryPolicy(backoff=0.01, max_backoff=0.05, provider_retries=3, circuit_failures=0)


def plan(**kw: Any) -> RunPlan:
    options: dict[str, Any] = {
        "run_id": "run",
        "rollouts_per_task": 2,
        "max_concurrent": 4,
        "retry": FAST,
    }
    options.update(kw)
    return RunPlan(**options)


# -- the window ------------------------------------------------------------------------------


async def test_window_bounds_rollouts_in_flight_and_every_group_is_finished() -> None:
    backend = FakeBackend(latency=0.02)
    driver = RunDriver(plan(max_concurrent=3), backend)
    progress = await driver.run(tasks(10))
    assert backend.peak == 3
    assert progress.done == progress.submitted == 20 and progress.errored == 0
    assert progress.episodes == 10 and progress.mean_reward == 1.0
    assert sorted(key for key, _, _ in backend.finished) == sorted(t.key for t in tasks(10))
    # One episode id per task, shared by its rollouts.
    ids = {(c.key, c.episode_id) for c in backend.calls}
    assert len(ids) == 10


async def test_tasks_are_pulled_lazily_as_the_window_frees() -> None:
    pulled: list[int] = []

    def source() -> Iterator[Scored]:
        for i, task in enumerate(tasks(50)):
            pulled.append(i)
            yield task

    backend = FakeBackend(latency=0.05)
    driver = RunDriver(plan(max_concurrent=4), backend)
    run = asyncio.ensure_future(driver.run(source()))
    await asyncio.sleep(0.02)
    assert len(pulled) <= 3  # 2 tasks fill the window of 4 rollouts; a third waits for a slot
    await run
    assert len(pulled) == 50


# -- retries ---------------------------------------------------------------------------------


async def test_interception_failures_are_retried_at_once_and_every_attempt_kept() -> None:
    backend = FakeBackend(script=lambda key, i, a: "InterceptionError" if a < 2 else None)
    driver = RunDriver(plan(max_retries=2), backend)
    progress = await driver.run(tasks(2))
    assert progress.errored == 0 and progress.retried == 8
    assert [t.attempt for t in backend.kept].count(0) == 4
    assert all(attempts == [2, 2] for _, _, attempts in backend.finished)


async def test_retries_stop_at_max_retries_and_task_errors_are_not_retried() -> None:
    def script(key: str, index: int, attempt: int) -> Step:
        return "TaskError" if key == "t0" else "InterceptionError"

    backend = FakeBackend(script=script)
    progress = await driver_run(backend, tasks(2), max_retries=1)
    assert progress.errored == 4
    assert progress.errors == {"TaskError": 2, "InterceptionError": 2}
    attempts = {(c.key, c.index): c.attempt for c in backend.calls}
    assert attempts[("t0", 0)] == 0 and attempts[("t1", 0)] == 1


async def driver_run(backend: FakeBackend, items: Iterable[Scored], **kw: Any) -> Any:
    return await RunDriver(plan(**kw), backend).run(items)


async def test_lost_host_is_retried_on_another_host_and_the_lost_attempt_kept() -> None:
    def script(key: str, index: int, attempt: int) -> Step:
        return HostLost("ActorDiedError: the node went away") if attempt == 0 else None

    backend = FakeBackend(script=script, num_hosts=2)
    progress = await driver_run(backend, tasks(3))
    assert progress.errored == 0 and progress.retried == 6
    assert {t.error().type for t in backend.kept if t.error()} == {"InfrastructureError"}
    by_rollout: dict[tuple[str, int], list[int]] = {}
    for call in backend.calls:
        by_rollout.setdefault((call.key, call.index), []).append(call.host)
    assert all(len(hosts) == 2 and hosts[0] != hosts[1] for hosts in by_rollout.values())


def test_a_lost_host_is_picked_last_until_it_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    pool = HostPool(3)
    pool.lost(0)
    # Hosts 1 and 2 take the work even once they are busier than the restarting host 0.
    assert sorted(pool.acquire() for _ in range(4)) == [1, 1, 2, 2]
    pool.answered(0)
    assert pool.acquire() == 0
    # The cooldown also ends on its own: a restarted host that got no rollout is used again.
    monkeypatch.setattr(run_hosts, "HOST_COOLDOWN_S", 0.0)
    pool.lost(1)
    pool.release(2)
    pool.release(2)
    assert pool.load == [1, 2, 0] and pool.acquire() == 2
    assert pool.acquire() == 0 and pool.acquire() == 2


async def test_a_host_lost_on_every_attempt_fails_the_rollout_as_infrastructure() -> None:
    backend = FakeBackend(script=lambda key, i, a: HostLost("gone"))
    progress = await driver_run(backend, tasks(1), max_retries=1)
    assert progress.errors == {"InfrastructureError": 2}
    assert len(backend.finished) == 1  # the group is still scored and written


async def test_provider_failures_are_retried_after_a_growing_backoff() -> None:
    backend = FakeBackend(script=lambda key, i, a: "ProviderError" if a < 3 else None, latency=0.0)
    policy = RetryPolicy(backoff=0.1, max_backoff=1.0, provider_retries=3, circuit_failures=0)
    progress = await driver_run(backend, tasks(1), retry=policy)
    assert progress.errored == 0 and progress.retried == 6
    starts = sorted(c.started for c in backend.calls if c.index == 0)
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    # Jitter keeps each wait within [50%, 100%] of 0.1, 0.2, 0.4 s.
    for gap, base in zip(gaps, (0.1, 0.2, 0.4), strict=True):
        assert gap >= base * 0.5 - 0.01, gaps


async def test_provider_retries_are_bounded() -> None:
    backend = FakeBackend(script=lambda key, i, a: "ProviderError", latency=0.0)
    progress = await driver_run(
        backend, tasks(1), retry=FAST.model_copy(update={"provider_retries": 2})
    )
    assert progress.errors == {"ProviderError": 2}
    assert max(c.attempt for c in backend.calls) == 2


def test_backoff_is_exponential_capped_and_jittered() -> None:
    policy = RetryPolicy(backoff=1.0, max_backoff=8.0)
    rng = random.Random(0)
    for retry, base in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (9, 8.0)]:
        waits = {policy.delay(retry, rng) for _ in range(50)}
        assert all(base * 0.5 <= w <= base for w in waits)
        assert len(waits) > 1  # jittered


# -- the endpoint circuit ----------------------------------------------------------------------


async def test_an_endpoint_outage_holds_new_starts_and_every_rollout_recovers() -> None:
    outage = {"until": 0.0}

    def script(key: str, index: int, attempt: int) -> Step:
        return "ProviderError" if time.monotonic() < outage["until"] else None

    backend = FakeBackend(script=script, latency=0.02)
    # Two retries alone are spent in ~0.3 s of a 1 s outage: the circuit is what saves them.
    policy = RetryPolicy(backoff=0.05, max_backoff=0.2, provider_retries=2, circuit_failures=3)
    driver = RunDriver(plan(max_concurrent=4, retry=policy), backend)
    seen_down: list[float] = []

    async def watch() -> None:
        while True:
            if driver.progress.endpoint_down_since is not None:
                seen_down.append(driver.progress.endpoint_down_since)
            await asyncio.sleep(0.01)

    watcher = asyncio.ensure_future(watch())
    run = asyncio.ensure_future(driver.run(tasks(30)))
    await asyncio.sleep(0.1)
    outage["until"] = time.monotonic() + 1.0
    down_from = time.monotonic()
    progress = await run
    watcher.cancel()
    assert progress.errored == 0 and progress.done == 60
    assert seen_down, "the progress data should show the endpoint down"
    assert driver.progress.endpoint_down_since is None  # up again at the end
    # Held: only one probe at a time starts while it is down, and no new rollout.
    during = [c for c in backend.calls if down_from + 0.2 < c.started < down_from + 0.95]
    assert all(c.attempt > 0 for c in during), during


async def test_circuit_opens_after_k_failures_paces_probes_and_a_good_one_closes_it() -> None:
    circuit = EndpointCircuit(RetryPolicy(backoff=0.1, max_backoff=0.4, circuit_failures=2))
    assert await circuit.admit() is False
    circuit.record(True)
    assert circuit.down_since is None
    circuit.record(True)
    assert circuit.down_since is not None and circuit.holding
    started = time.monotonic()
    assert await circuit.admit() is True  # the first probe, after the cool-down
    assert time.monotonic() - started >= 0.09
    circuit.record(True, probe=True)  # it failed: the next one waits twice as long
    started = time.monotonic()
    assert await circuit.admit() is True
    assert time.monotonic() - started >= 0.19
    waiter = asyncio.ensure_future(circuit.admit())
    await asyncio.sleep(0.05)
    assert not waiter.done()  # no second probe within the cool-down
    circuit.record(False, probe=True)
    assert await asyncio.wait_for(waiter, 1) is False  # up again: everyone goes
    assert circuit.down_since is None and not circuit.holding


async def test_circuit_stops_holding_after_max_outage() -> None:
    policy = RetryPolicy(backoff=0.15, max_backoff=1.0, circuit_failures=1, max_outage=0.25)
    circuit = EndpointCircuit(policy)
    circuit.record(True)
    assert await circuit.admit() is True
    circuit.record(True, probe=True)  # the next probe would be due after the outage limit
    waiter = asyncio.ensure_future(circuit.admit())
    await asyncio.sleep(0.03)
    assert not waiter.done()
    assert await asyncio.wait_for(waiter, 1) is False  # released by max_outage
    assert circuit.down_since is not None and not circuit.holding


def test_one_requests_failures_in_a_row_poison_it_instead_of_opening_the_circuit() -> None:
    circuit = EndpointCircuit(RetryPolicy(circuit_failures=3))
    for _ in range(3):
        circuit.record(True, source="p")
    assert circuit.down_since is None and circuit.poisoned("p")
    circuit.record(True, source="p")  # its failures stop counting
    circuit.record(True, source="a")
    circuit.record(True, source="b")
    assert circuit.down_since is None
    circuit.record(True, source="a")  # three in a row across distinct requests: an outage
    assert circuit.down_since is not None and not circuit.poisoned("a")
    circuit.record(False, source="p")  # a success clears both judgements
    assert circuit.down_since is None and not circuit.poisoned("p")


def test_probes_of_one_task_failing_in_an_outage_judge_nothing() -> None:
    circuit = EndpointCircuit(RetryPolicy(circuit_failures=3))
    for source in ("a", "p", "p"):
        circuit.record(True, source=source)
    assert circuit.down_since is not None  # distinct sources: an outage
    for _ in range(4):  # the circuit's one probe at a time happens to be p's, and fails
        circuit.record(True, probe=True, source="p")
    # In an outage every probe fails: p is not told apart from the endpoint by its probes.
    assert circuit.down_since is not None and not circuit.poisoned("p")
    circuit.record(False, probe=True, source="p")
    assert circuit.down_since is None


async def test_a_poisoned_group_alone_in_flight_arrives_with_its_errors_at_once() -> None:
    # The only rollouts in flight fail identically (a prompt the endpoint answers 500): with a
    # circuit they opened, they used to retry without spending their budgets until max_outage
    # (900 s). Now its task is judged poisoned and the group arrives after a few attempts.
    def script(key: str, index: int, attempt: int) -> Step:
        return "ProviderError" if key == "t0" else None

    backend = FakeBackend(script=script)
    policy = RetryPolicy(backoff=0.01, max_backoff=0.05, provider_retries=6, circuit_failures=5)
    driver = RunDriver(plan(rollouts_per_task=4, max_concurrent=4, retry=policy), backend)
    progress = await driver.run(tasks(1))
    assert progress.errored == 4 and progress.done == 4
    assert driver.circuit.poisoned("t0") and driver.circuit.down_since is None
    attempts = [c.attempt for c in backend.calls]
    # Four first attempts, then at most one retry each (the fifth failure judged the request):
    # well under the budget of 1 + 6 attempts per rollout.
    assert attempts.count(0) == 4 and max(attempts) <= 1 and len(attempts) <= 8, attempts
    assert [key for key, _, _ in backend.finished] == ["t0"]


async def test_a_poisoned_group_does_not_hold_the_others() -> None:
    def script(key: str, index: int, attempt: int) -> Step:
        return "ProviderError" if key == "t1" else None

    backend = FakeBackend(script=script)
    policy = RetryPolicy(backoff=0.01, max_backoff=0.05, provider_retries=6, circuit_failures=3)
    driver = RunDriver(plan(rollouts_per_task=4, max_concurrent=8, retry=policy), backend)
    progress = await driver.run(tasks(5))
    assert progress.errored == 4 and progress.done == 20
    assert driver.circuit.poisoned("t1") and driver.circuit.down_since is None
    assert sorted(key for key, _, _ in backend.finished) == ["t0", "t1", "t2", "t3", "t4"]
    assert all(c.attempt == 0 for c in backend.calls if c.key != "t1")


# -- refusal, resume -------------------------------------------------------------------------


async def test_a_task_no_node_can_fit_refuses_the_run_in_one_line() -> None:
    backend = FakeBackend(unfit_keys={"t0"})
    with pytest.raises(ConfigError, match=r"^task t0: needs a GPU nobody has$"):
        await driver_run(backend, tasks(3))
    assert backend.calls == [] and backend.finished == []  # refused before any rollout ran


async def test_resume_runs_only_missing_rollouts_with_the_next_attempt_number() -> None:
    items = tasks(3)
    done = Trace(task=items[0].record(), rollout_index=1, attempt=0, episode_id="e0")
    done.rewards["one"] = RewardRecord(value=1.0)
    resume = {
        "t0": ResumeState(episode_id="e0", done={1: done}, next_attempt={0: 2}),
        "t1": ResumeState(
            episode_id="e1",
            done={i: Trace(task=items[1].record(), rollout_index=i) for i in range(2)},
        ),
    }
    backend = FakeBackend()
    driver = RunDriver(plan(), backend, resume=resume)
    progress = await driver.run(items)
    assert progress.submitted == 3  # t0 index 0, t2 both; t1 was complete
    assert sorted((c.key, c.index, c.attempt) for c in backend.calls) == [
        ("t0", 0, 2),
        ("t2", 0, 0),
        ("t2", 1, 0),
    ]
    assert {c.episode_id for c in backend.calls if c.key == "t0"} == {"e0"}
    finished = {key: previous for key, previous, _ in backend.finished}
    assert finished == {"t0": [1], "t2": []}  # the kept rollout joins its group's scoring


# -- cancellation and failures -----------------------------------------------------------------


async def test_cancelling_the_run_cancels_every_rollout_and_finishes_no_group() -> None:
    backend = FakeBackend(latency=5.0)
    driver = RunDriver(plan(max_concurrent=6), backend)
    run = asyncio.ensure_future(driver.run(tasks(10)))
    while backend.in_flight < 6:
        await asyncio.sleep(0.01)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert backend.in_flight == 0
    assert backend.finished == []


async def test_a_backend_cancelling_its_rollouts_ends_the_run() -> None:
    """A host that cancels its rollouts (Farm.close, the job stopped) ends the whole run."""

    def script(key: str, index: int, attempt: int) -> Step:
        return asyncio.CancelledError("host shut down") if key == "t1" else None

    backend = FakeBackend(script=script)
    with pytest.raises(asyncio.CancelledError):
        await driver_run(backend, tasks(4), max_concurrent=2)


async def test_a_failing_task_source_ends_the_run_after_the_started_groups() -> None:
    def source() -> Iterator[Scored]:
        yield from tasks(3)
        raise KeyError("shard-7")

    backend = FakeBackend(latency=0.1)
    with pytest.raises(vf.TasksetError, match=r"after 3 tasks: KeyError: 'shard-7'"):
        await driver_run(backend, source(), max_concurrent=8)
    assert sorted(key for key, _, _ in backend.finished) == ["t0", "t1", "t2"]


async def test_a_vfray_error_from_the_source_is_raised_as_it_is() -> None:
    def source() -> Iterator[Scored]:
        yield from tasks(1)
        raise vf.ConfigError("Scored has group rewards; n must be at least 2")

    backend = FakeBackend()
    with pytest.raises(vf.ConfigError, match="group rewards"):
        await driver_run(backend, source())
    assert len(backend.finished) == 1


async def test_every_episode_failing_to_write_raises_one_error_and_leaves_none_unretrieved(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A full disk fails every episode's write: the run raises the first failure, and the later
    episodes' failures are retrieved (asyncio does not log them as "never retrieved")."""

    class FullDisk(FakeBackend):
        async def finish(self, *args: Any, **kwargs: Any) -> EpisodeOutcome:
            await asyncio.sleep(0)
            raise SinkError("no space left on device")

    backend = FullDisk()
    with pytest.raises(SinkError, match="no space"):
        await driver_run(backend, tasks(6), max_concurrent=8)
    import gc

    gc.collect()  # asyncio reports unretrieved task exceptions when the task is collected
    await asyncio.sleep(0)
    # (Only this run's: a task an earlier test in this process left may be reported here too.)
    unretrieved = [r.getMessage() for r in caplog.records if "never retrieved" in r.getMessage()]
    assert not [m for m in unretrieved if "SinkError" in m or "_finish" in m], unretrieved


# -- streaming -----------------------------------------------------------------------------------


async def test_groups_in_flight_bound_how_stale_a_slow_consumers_groups_get() -> None:
    backend = FakeBackend(latency=0.005)
    delivered: list[str] = []
    worst = 0

    async def slow_trainer(outcome: EpisodeOutcome) -> None:
        nonlocal worst
        started = {c.episode_id for c in backend.calls}
        worst = max(worst, len(started) - len(delivered))
        await asyncio.sleep(0.05)  # a training step
        delivered.append(outcome.episode_id)

    driver = RunDriver(
        plan(max_concurrent=16, max_groups_in_flight=3, keep_episodes=True),
        backend,
        on_episode=slow_trainer,
    )
    await driver.run(tasks(12))
    assert len(delivered) == 12
    # The window alone would let 8 groups start; the bound keeps it at 3.
    assert worst <= 3, worst
