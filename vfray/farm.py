"""``Farm``: the public Python API — run a taskset to a run folder, or stream scored episode
groups into a training loop.

The config is resolved once into a :class:`~vfray.run.spec.RunSpec`; the driver
(:mod:`vfray.run.driver`) iterates tasks lazily with at most ``max_concurrent`` rollouts in
flight over a farm backend (:mod:`vfray.run.backends`), named by the config and loaded by
import path so this module never imports Ray. ``backend="ray"`` (the default,
``actors.ray_farm``): rollouts run in SandboxHost actors spread over the nodes, episodes are Ray
tasks, and rows stream into Parquet parts through a TraceSink actor. ``backend="local"``
(:mod:`vfray.run.local`): the same driver and run folder from one process with no Ray.

Internal: importable, but not the public API (:mod:`vfray`, :mod:`vfray.testing`,
:mod:`vfray.train`, :mod:`vfray.compat.v1`); names here may move.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vfray._plugins import load_object
from vfray._stream_groups import (
    GroupDelivery,
    check_staleness_options,
    refuse_tokenless,
    token_check,
)
from vfray._sync import run_sync
from vfray.config import EvalConfig, ModelConfig
from vfray.errors import ConfigError
from vfray.rollout import RolloutPlan
from vfray.run.backends import FarmBackend
from vfray.run.driver import RunBackend, RunDriver
from vfray.run.folders import run_folder, run_header
from vfray.run.outcomes import EpisodeGroup
from vfray.run.plan import RunPlan
from vfray.run.progress import Baseline, live_progress
from vfray.run.spec import RunSpec, resolve_run
from vfray.run.staleness import Requeue
from vfray.run.streams import GroupStream
from vfray.task import Task
from vfray.trace import AgentInfo

if TYPE_CHECKING:
    from vfray.run.results import RunResult

# pyarrow (via vfray.run.results and vfray.traces) is imported where it is used, not here: a local
# run's first rollout does not need it, and it is a third of the CLI's import time.

BACKENDS = {"ray": "actors.ray_farm:RayFarm", "local": "vfray.run.local:LocalFarm"}
"""The farm backend of each ``backend`` setting, by import path: Ray is imported only by the
backend that uses it."""


class Farm:
    """Runs rollouts on a Ray cluster (a local one is started when none is given), or with
    ``backend="local"`` in this process without Ray."""

    def __init__(
        self,
        model: str | None = None,
        *,
        config: EvalConfig | None = None,
        harness: str | None = None,
        runtime: str | None = None,
        max_concurrent: int | None = None,
        output_dir: str | None = None,
        base_url: str | None = None,
        api_key_var: str | None = None,
        sampling: dict[str, Any] | None = None,
        address: str | None = None,
        backend: str | None = None,
        hosts: int | None = None,
        host_concurrency: int | None = None,
        max_retries: int | None = None,
        progress: bool = True,
        flush_rows: int | None = None,
        flush_seconds: float | None = None,
        num_cpus: int | None = None,
    ) -> None:
        cfg = (config or EvalConfig()).model_copy(deep=True)
        if model is not None or base_url is not None or api_key_var is not None:
            cfg.model = ModelConfig(
                name=model or cfg.model.name,
                base_url=base_url or cfg.model.base_url,
                api_key_var=api_key_var or cfg.model.api_key_var,
            )
        if harness is not None:
            cfg.env.harness.id = harness
        if runtime is not None:
            cfg.env.runtime.type = runtime
        if max_concurrent is not None:
            cfg.max_concurrent = max_concurrent
        if output_dir is not None:
            cfg.output_dir = output_dir
        if sampling is not None:
            cfg.sampling = cfg.sampling.model_validate(sampling)
        if address is not None:
            cfg.address = address
        if backend is not None:
            cfg.backend = backend  # type: ignore[assignment]  # validated just below
        self._knobs: dict[str, Any] = {
            "hosts": hosts,
            "host_concurrency": host_concurrency,
            "max_retries": max_retries,
            "flush_rows": flush_rows,
            "flush_seconds": flush_seconds,
            "num_cpus": num_cpus,
        }
        self.progress = progress
        self.policy_version: int | None = None
        self.stale_groups = 0
        """Groups a stream refused for staleness (``max_staleness``), dropped or run again."""
        self._resolve(cfg)
        self._closed = False
        self._started = False
        self._streams: list[GroupStream] = []

    def _resolve(self, cfg: EvalConfig) -> None:
        self.spec: RunSpec = resolve_run(cfg, self._knobs)
        self.config = self.spec.config
        self._backend: FarmBackend = load_object(BACKENDS[self.spec.backend])(self.spec)
        if self.policy_version is not None:
            self._backend.set_policy_version(self.policy_version)

    @property
    def plan(self) -> RolloutPlan:
        return self.spec.plan

    @property
    def _hosts(self) -> list[Any]:
        """The SandboxHost actors (Ray; for tests and benchmarks that kill or sample them)."""
        return list(getattr(self._backend, "hosts", []))

    @property
    def _model_actor(self) -> Any:
        return getattr(self._backend, "model_actor", None)

    @property
    def _pool(self) -> Any:
        """The interception deployment (Ray, ``farm.interception = "serve"``; for tests)."""
        return getattr(self._backend, "pool", None)

    # -- lifecycle ------------------------------------------------------------------------

    def _start(self) -> None:
        if self._closed:
            raise RuntimeError("this Farm is closed")
        self._started = True
        self._backend.start()

    def close(self) -> None:
        """Cancel every rollout (tearing its sandbox down) and release the actors. Called on a
        stream's own event loop (leaving ``with Farm`` inside the training coroutine), the
        release waits until the stream's run has finished its clean-up on that loop."""
        if self._closed:
            return
        self._closed = True
        if not self._streams:
            self._backend.interrupt()
        running = [s for s in self._streams if s.running]
        self._streams = []
        if not running:
            self._release()
            return
        try:
            asyncio.get_running_loop()
            on_loop = True
        except RuntimeError:
            on_loop = False
        if not on_loop:
            for stream in running:
                stream.cancel_and_wait()
            self._release()
            return
        pending = {id(s) for s in running}

        def finished(stream_id: int) -> None:
            pending.discard(stream_id)
            if not pending:
                self._release()

        for stream in running:
            stream.cancel(functools.partial(finished, id(stream)))

    def _release(self) -> None:
        self._backend.close()

    async def __aenter__(self) -> Farm:
        return self

    async def __aexit__(self, *exc: object) -> None:
        """Close, first waiting (without blocking the loop) for open streams' clean-up."""
        streams, self._streams = self._streams, []
        for stream in streams:
            await stream.aclose()
        await asyncio.to_thread(self.close)

    def __enter__(self) -> Farm:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def host_stats(self) -> list[dict[str, Any]]:
        """Per SandboxHost: node, pid, rollouts in flight and completed, live sessions."""
        return self._backend.stats()

    def set_policy_version(self, version: int | None) -> None:
        """Stamp ``version`` on every ModelCall from now on (RL: the trainer's step)."""
        self.policy_version = version
        self._backend.set_policy_version(version)

    # -- runs -----------------------------------------------------------------------------

    def _run_dir(self, name: str, resume: str | Path | None) -> tuple[Path, str]:
        return run_folder(self.config, name, resume)

    def _header(self, run_id: str, name: str, n: int) -> dict[str, Any]:
        return run_header(self.config, run_id, name, n)

    def run(
        self,
        tasks: Iterable[Task[Any]],
        rollouts_per_task: int = 1,
        *,
        resume: str | Path | None = None,
        name: str | None = None,
        on_run_dir: Callable[[Path], object] | None = None,
    ) -> RunResult:
        """Run every task ``rollouts_per_task`` times; blocks, showing live progress.
        ``on_run_dir`` is told the run folder before the first rollout starts."""
        # Start Ray here, on the caller's thread: inside a running loop (Jupyter) run_sync moves
        # the run to a helper thread, where ray.init cannot install its signal handlers.
        self._start()
        return run_sync(
            self.run_async(
                tasks, rollouts_per_task, resume=resume, name=name, on_run_dir=on_run_dir
            ),
            self.config.farm.event_loop,
        )

    async def run_async(
        self,
        tasks: Iterable[Task[Any]],
        rollouts_per_task: int = 1,
        *,
        resume: str | Path | None = None,
        name: str | None = None,
        on_run_dir: Callable[[Path], object] | None = None,
    ) -> RunResult:
        """:meth:`run` for async callers; returns when every row is written."""
        tasks = _v1_adapted(tasks)
        name = name or getattr(tasks, "name", None) or "tasks"
        run_dir, run_id = self._run_dir(name, resume)
        if on_run_dir is not None:
            on_run_dir(run_dir)
        resume_state = {}
        if resume is not None:
            # Imported only here: it reads Parquet (pyarrow), which a fresh run's start-up
            # does not need.
            from vfray.run.resume import load_resume_state

            resume_state = load_resume_state(run_dir)
        plan = self._run_plan(run_id, rollouts_per_task, streaming=False)
        total = _known_length(tasks, rollouts_per_task)
        header = self._header(run_id, name, rollouts_per_task)
        async with self._open_run(run_dir, header) as backend:
            driver = RunDriver(plan, backend, None, resume_state)
            async with live_progress(
                driver.progress, total, enabled=self.progress, baseline=Baseline.of(resume_state)
            ):
                await driver.run(self._checked(tasks, rollouts_per_task))
        from vfray.run.results import RunResult

        return RunResult(run_dir)

    def stream(
        self,
        tasks: Iterable[Task[Any]],
        rollouts_per_task: int = 2,
        *,
        name: str | None = None,
        tokens: bool = True,
        max_staleness: int | None = None,
        on_stale: str = "drop",
    ) -> GroupStream:
        """Yield each task's scored group as soon as it finishes (for RL training loops), as an
        async iterator. Rows are also written to a run folder, as with :meth:`run`. Stopping
        early is clean: ``break`` and leave the ``with Farm`` block (or ``await
        stream.aclose()``); every box is torn down and the rows written so far are kept.

        ``tokens`` (training mode, the default): the endpoint is asked for token ids and
        logprobs (``sampling.return_tokens = "required"``). An endpoint known not to return
        them is refused here, before anything runs; otherwise the first model call answered
        without them stops its rollout, and the stream stops with a one-line
        :class:`~vfray.errors.ConfigError` as soon as that rollout is back, before any group
        reaches the trainer. A group with fewer than 2 rollouts that count
        (:attr:`EpisodeGroup.trainable`) is yielded with no advantages, and logged.

        ``max_staleness=k`` (asynchronous RL; prime-rl's ``max_async_level``): a group whose
        oldest call was made more than ``k`` policy versions before the current one
        (:meth:`set_policy_version`) when it arrives is not yielded: ``on_stale="drop"`` drops
        it, ``"rerun"`` runs its task again at the current weights (at most
        :data:`~vfray.run.staleness.MAX_RERUNS` times, then drops it). Each is logged and
        counted in :attr:`stale_groups`."""
        check_staleness_options(max_staleness, on_stale)
        tasks = _v1_adapted(tasks)
        name = name or getattr(tasks, "name", None) or "tasks"
        if self._closed:
            raise RuntimeError("this Farm is closed")
        if tokens:
            refuse_tokenless(self.spec)
            if self.config.sampling.return_tokens != "required":
                self._ask_for_tokens()
        check_tokens = token_check(self.config.model.name)

        async def produce(deliver: Callable[[EpisodeGroup], Awaitable[None]]) -> None:
            run_dir, run_id = self._run_dir(name, None)

            source = Requeue(self._checked(tasks, rollouts_per_task))
            deliver_outcome = GroupDelivery(
                source,
                deliver,
                on_prefix_break=self.config.env.on_prefix_break,
                max_staleness=max_staleness,
                on_stale=on_stale,
                policy_version=lambda: self.policy_version,
                count_stale=self._count_stale,
            )
            plan = self._run_plan(run_id, rollouts_per_task, streaming=True)
            header = self._header(run_id, name, rollouts_per_task)
            async with self._open_run(run_dir, header) as backend:
                while True:
                    driver = RunDriver(
                        plan, backend, deliver_outcome, on_rollout=check_tokens if tokens else None
                    )
                    await driver.run(source)
                    if not source.queued:
                        break
                    # Stale groups found after the tasks ran out: their reruns get a pass.

        stream = GroupStream(produce)
        self._streams.append(stream)
        return stream

    def _count_stale(self) -> None:
        self.stale_groups += 1

    def _ask_for_tokens(self) -> None:
        """Set ``sampling.return_tokens = "required"``, before anything started. A farm that
        already started asking for them (``True``) keeps going: the stream still refuses the
        first rollout whose calls came back without them, only after the agent ran."""
        if self._started:
            if self.config.sampling.return_tokens:
                return
            raise ConfigError(
                "this farm already started without asking the endpoint for token ids; build it "
                "with sampling={'return_tokens': True} to train, or pass tokens=False"
            )
        cfg = self.config.model_copy(deep=True)
        cfg.sampling.return_tokens = "required"
        self._resolve(cfg)

    def _run_plan(self, run_id: str, n: int, *, streaming: bool) -> RunPlan:
        return RunPlan(
            run_id=run_id,
            rollouts_per_task=n,
            max_concurrent=self.spec.concurrency.max_concurrent,
            max_retries=self.spec.concurrency.max_retries,
            scoring_overrides=dict(self.config.env.scoring),
            agent=AgentInfo(
                harness=self.config.env.harness.id,
                runtime=self.config.env.runtime.type,
                model=self.config.model.name,
                sampling=self.config.sampling.as_params(),
            ),
            keep_episodes=streaming,
            max_groups_in_flight=(
                max(1, self.spec.concurrency.max_concurrent // n) if streaming else None
            ),
            scoring_timeout=self.config.env.timeouts.scoring,
            retry=self.config.retry,
            count_failed=self.config.env.count_failed,
            advantage=self.config.env.advantage,
        )

    @contextlib.asynccontextmanager
    async def _open_run(self, run_dir: Path, header: dict[str, Any]) -> AsyncIterator[RunBackend]:
        """The backend for one run; on the way out every buffered row is written (also when
        the run fails or is cancelled), then the run's own resources are released."""
        if self._closed:
            raise RuntimeError("this Farm is closed")
        self._started = True
        async with self._backend.open_run(run_dir, header) as backend:
            yield backend

    def _checked(self, tasks: Iterable[Task[Any]], n: int) -> Iterator[Task[Any]]:
        """Validate each task class once, lazily (a group reward with n < 2, the config's
        overrides included, is refused), and let the backend prepare it; and each task's image
        (malformed, or one the runtime cannot run)."""
        seen: set[type] = set()
        for task in tasks:
            if not isinstance(task, Task):
                raise ConfigError(f"expected vfray Task objects, got {type(task).__name__}")
            self.spec.check_task(task)
            if type(task) not in seen:
                self.spec.check_task_type(type(task), n)
                self._backend.prepare(task)
                seen.add(type(task))
            yield task


def _known_length(tasks: Iterable[Any], n: int) -> int | None:
    try:
        return len(tasks) * n  # type: ignore[arg-type]
    except Exception:  # a generator (TypeError) or an infinite taskset (TasksetError)
        return None


def _v1_adapted(tasks: Iterable[Task[Any]]) -> Iterable[Task[Any]]:
    """A verifiers v1 taskset (:mod:`vfray.compat.v1`) runs as it is: adapted here. The layer is
    looked up only when something already imported it."""
    layer = sys.modules.get("vfray.compat.v1")
    if layer is not None and isinstance(tasks, layer.Taskset):
        adapted: Iterable[Task[Any]] = layer.adapt(tasks)
        return adapted
    return tasks
