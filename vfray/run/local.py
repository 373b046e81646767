"""The in-process backend of the run driver (:mod:`vfray.run.driver`): no Ray at all. Rollouts run
through a :class:`~vfray.run.environment.LocalEnvironment` (one interception server in this event
loop, harness programs as child processes), groups are scored in this loop, and rows go to a
sink object in this process.

Why it exists: a Ray-backed ``vfray eval`` pays for starting Ray (GCS, raylet, workers that each
import vfray and pyarrow: seconds and ~2 GiB RSS) before its first rollout. On one machine that
buys nothing a single event loop cannot do, so ``backend="local"`` skips it: start-up is imports
plus the first rollout, and memory is one Python process plus the harness programs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from vfray.harnesses.seats import SeatedTask
from vfray.run.environment import LocalEnvironment
from vfray.run.outcomes import (
    EpisodeJob,
    EpisodeOutcome,
    RolloutJob,
    RolloutOutcome,
    finish_episode,
    played,
)
from vfray.run.placement import Placement, this_machine
from vfray.run.spec import RunSpec
from vfray.task import Task
from vfray.trace import Trace

if TYPE_CHECKING:
    import pyarrow as pa


class RowSink(Protocol):
    """What the backend writes to (``vfray.run.sink.TraceSink`` used in-process)."""

    async def append(
        self, traces: pa.Table | None, episodes: pa.Table | None = None, key: str | None = None
    ) -> int: ...

    async def close(self) -> int: ...


def write_run_header(run_dir: Path, header: dict[str, Any]) -> None:
    """``config.json``, written once when the run starts (a resumed run keeps its own)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "config.json"
    if not path.exists():
        path.write_text(json.dumps(header, indent=2, sort_keys=True, default=str))


class LocalBackend:
    """One "host": this process. Handles are the traces themselves.

    The sink is made on first use: it pulls in pyarrow, which the first rollout does not need.
    """

    num_hosts = 1

    def __init__(self, env: LocalEnvironment, make_sink: Callable[[], RowSink]) -> None:
        self.env = env
        self._make_sink = make_sink
        self.sink: RowSink | None = None
        self.in_flight = 0
        self.completed = 0
        self.placement = Placement([("local", this_machine())], "this machine")

    def _sink(self) -> RowSink:
        if self.sink is None:
            self.sink = self._make_sink()
        return self.sink

    async def rollout(self, host: int, job: RolloutJob) -> tuple[RolloutOutcome, Any]:
        # run_planned_rollout records every failure on the trace; only cancellation raises,
        # and there is no host under it that could be lost.
        self.in_flight += 1
        ids: dict[str, Any] = {
            "rollout_index": job.index,
            "attempt": job.attempt,
            "run_id": job.run_id,
            "episode_id": job.episode_id,
        }
        try:
            if isinstance(job.task, SeatedTask):
                traces = await self.env.game(job.task, **ids)
                self.completed += 1
                return RolloutOutcome.of_game(traces), traces
            trace = await self.env.rollout(job.task, **ids)
        finally:
            self.in_flight -= 1
        self.completed += 1
        return RolloutOutcome.of(trace), trace

    def hold(self, trace: Trace) -> Any:
        return trace

    async def keep_attempt(self, handle: Any) -> None:
        from vfray.traces.convert import traces_to_table

        await self._sink().append(traces_to_table(played([handle])))

    async def finish(self, job: EpisodeJob, handles: list[Any]) -> EpisodeOutcome:
        outcome, (trace_rows, episode_rows) = await finish_episode(job, list(handles))
        await self._sink().append(trace_rows, episode_rows, job.episode_id)
        return outcome

    def unfit(self, task: Task[Any]) -> str | None:
        # Against this machine's CPUs, memory and GPUs: the run is refused in one line.
        return self.placement.unfit(task.data.resources)

    async def close(self) -> None:
        """Write every buffered row (nothing to do when no episode finished)."""
        if self.sink is not None:
            await self.sink.close()

    def stats(self) -> dict[str, Any]:
        return {
            "node_id": "local",
            "pid": os.getpid(),
            "in_flight": self.in_flight,
            "completed": self.completed,
            "sessions": self.env.interception.app.session_count,
            "url": self.env.interception.url,
        }


class LocalRun:
    """A local run in progress: its backend, and a way to cancel it from any thread."""

    def __init__(self, backend: LocalBackend) -> None:
        self.backend = backend
        task = asyncio.current_task()
        assert task is not None, "a local run runs inside a task"
        self._task = task
        self._loop = asyncio.get_running_loop()
        self.finished = threading.Event()

    def cancel(self) -> None:
        """Cancel the run: its rollouts tear their sandboxes down and the rows written so far
        are flushed. From another thread, wait for that; on the run's own loop, we can't."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            self._task.cancel()
            return
        self._loop.call_soon_threadsafe(self._task.cancel)
        self.finished.wait(timeout=120)


class LocalFarm:
    """The farm-lifetime backend (:class:`~vfray.run.backends.FarmBackend`) in this process:
    each run gets its own model endpoint and interception, and a sink object writes its rows."""

    def __init__(self, spec: RunSpec) -> None:
        self.spec = spec
        self.policy_version: int | None = None
        self.run: LocalRun | None = None  # the run in progress
        self._checked = False

    def start(self) -> None:
        if not self._checked:
            self.spec.preflight()
            self._checked = True

    @contextlib.asynccontextmanager
    async def open_run(self, run_dir: Path, header: dict[str, Any]) -> AsyncIterator[LocalBackend]:
        """Start the model endpoint and interception, write the run header, and yield the run's
        backend; on the way out every buffered row is written, also when the run fails or is
        cancelled."""
        self.start()
        concurrency = self.spec.concurrency

        def make_sink() -> RowSink:
            from vfray.run.sink import TraceSink

            return TraceSink(
                str(run_dir),
                header,
                flush_rows=concurrency.flush_rows,
                flush_seconds=concurrency.flush_seconds,
            )

        env = LocalEnvironment(spec=self.spec)
        write_run_header(run_dir, header)
        run: LocalRun | None = None
        try:
            async with env:
                env.interception.app.policy_version = self.policy_version
                run = self.run = LocalRun(LocalBackend(env, make_sink))
                try:
                    yield run.backend
                finally:
                    await run.backend.close()
        finally:
            self.run = None
            if run is not None:
                run.finished.set()

    def prepare(self, task: Task[Any]) -> None:
        pass  # the classes are right here

    def stats(self) -> list[dict[str, Any]]:
        return [self.run.backend.stats()] if self.run is not None else []

    def set_policy_version(self, version: int | None) -> None:
        self.policy_version = version
        if self.run is not None:
            self.run.backend.env.set_policy_version(version)

    def interrupt(self) -> None:
        if self.run is not None:
            self.run.cancel()

    def close(self) -> None:
        pass  # a run releases its own endpoint and interception
