"""The in-process backend of the run driver (:mod:`vfray.driver`): no Ray at all. Rollouts run
through a :class:`~vfray.environment.LocalEnvironment` (one interception server in this event
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

from vfray.config import EvalConfig
from vfray.environment import LocalEnvironment
from vfray.outcomes import EpisodeOutcome, EpisodeSpec, RolloutOutcome, finish_episode
from vfray.task import Task
from vfray.trace import Trace

if TYPE_CHECKING:
    import pyarrow as pa


class RowSink(Protocol):
    """What the backend writes to (``actors.sink.TraceSink`` used in-process)."""

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

    def _sink(self) -> RowSink:
        if self.sink is None:
            self.sink = self._make_sink()
        return self.sink

    async def rollout(
        self, host: int, task: Task[Any], index: int, attempt: int, run_id: str, episode_id: str
    ) -> tuple[RolloutOutcome, Any]:
        # run_planned_rollout records every failure on the trace; only cancellation raises,
        # and there is no host under it that could be lost.
        self.in_flight += 1
        try:
            trace = await self.env.rollout(
                task, rollout_index=index, attempt=attempt, run_id=run_id, episode_id=episode_id
            )
        finally:
            self.in_flight -= 1
        self.completed += 1
        return RolloutOutcome.of(trace), trace

    def hold(self, trace: Trace) -> Any:
        return trace

    async def keep_attempt(self, handle: Any) -> None:
        from vfray.traces.convert import traces_to_table

        await self._sink().append(traces_to_table([handle]))

    async def finish(
        self,
        task: Task[Any],
        episode_id: str,
        spec: EpisodeSpec,
        previous: list[Trace],
        handles: list[Any],
    ) -> EpisodeOutcome:
        outcome, (trace_rows, episode_rows) = await finish_episode(
            task, episode_id, spec, previous, list(handles)
        )
        await self._sink().append(trace_rows, episode_rows, episode_id)
        return outcome

    def unfit(self, task: Task[Any]) -> str | None:
        # A task asking for more CPUs or GPUs than this machine has fails at once, as data.
        res = task.data.resources
        cpus = os.cpu_count() or 1
        if res.cpu > cpus:
            return f"task needs {res.cpu:g} CPUs; this machine has {cpus}"
        return None

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


def environment_from_config(config: EvalConfig) -> LocalEnvironment:
    """The :class:`LocalEnvironment` a run with ``config`` needs (harness and runtime refused
    here when unknown or incompatible)."""
    env = config.env
    return LocalEnvironment(
        config.model.name,
        base_url=config.model.base_url,
        api_key_var=config.model.api_key_var,
        harness=env.harness.id,
        harness_options=env.harness.options,
        runtime=env.runtime.type,
        runtime_options=config.runtime_options(),
        sampling=config.sampling.as_params(),
        limits=env.limits(),
        timeouts=env.timeouts,
        scoring_overrides=env.scoring,
    )


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


@contextlib.asynccontextmanager
async def open_local_run(
    config: EvalConfig,
    run_dir: Path,
    header: dict[str, Any],
    make_sink: Callable[[], RowSink],
    policy_version: int | None = None,
) -> AsyncIterator[LocalRun]:
    """Start the model endpoint and interception, write the run header, and yield the run;
    on the way out every buffered row is written, also when the run fails or is cancelled."""
    env = environment_from_config(config)
    write_run_header(run_dir, header)
    run: LocalRun | None = None
    try:
        async with env:
            env.interception.app.policy_version = policy_version
            run = LocalRun(LocalBackend(env, make_sink))
            try:
                yield run
            finally:
                await run.backend.close()
    finally:
        if run is not None:
            run.finished.set()
