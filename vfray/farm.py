"""``Farm``: the public Python API — run a taskset to a run folder, or stream scored episode
groups into a training loop.

The driver (:mod:`vfray.driver`) iterates tasks lazily with at most ``max_concurrent`` rollouts
in flight over a backend. ``backend="ray"`` (the default): rollouts run in SandboxHost actors
spread over the nodes, episodes are Ray tasks, and rows stream into Parquet parts through a
TraceSink actor. ``backend="local"``: the same driver and run folder from one process with no
Ray (:mod:`vfray.local_backend`), for quick runs on one machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from vfray._run_folders import run_folder, run_header
from vfray.config import EvalConfig, ModelConfig, format_validation_error
from vfray.driver import RunBackend, RunDriver, RunPlan
from vfray.environment import parse_scripted_model
from vfray.errors import ConfigError
from vfray.models.local import parse_local_model
from vfray.outcomes import EpisodeGroup
from vfray.progress import Baseline, live_progress
from vfray.rollout import RolloutPlan
from vfray.scoring import validate_group_config
from vfray.streams import GroupStream
from vfray.sync import run_sync
from vfray.task import Task
from vfray.trace import AgentInfo

if TYPE_CHECKING:
    from actors.sink import TraceSink
    from vfray.local_backend import LocalRun
    from vfray.results import RunResult

# pyarrow (via vfray.results and vfray.traces) is imported where it is used, not here: a local
# run's first rollout does not need it, and it is a third of the CLI's import time.

log = logging.getLogger(__name__)


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
        # The farm knobs live in the config tree (farm.*); these arguments override them.
        knobs = {
            "hosts": hosts,
            "host_concurrency": host_concurrency,
            "max_retries": max_retries,
            "flush_rows": flush_rows,
            "flush_seconds": flush_seconds,
        }
        for knob, value in knobs.items():
            if value is not None:
                setattr(cfg.farm, knob, value)
        try:
            self.config = EvalConfig.model_validate(cfg.model_dump())
        except ValidationError as exc:
            raise ConfigError(format_validation_error(exc)) from exc
        self._validate_endpoint()
        layout = self.config.farm
        self.num_hosts = layout.hosts
        self.host_concurrency = layout.host_concurrency
        self.max_retries = layout.max_retries
        self.progress = progress
        self.flush_rows = layout.flush_rows
        self.flush_seconds = layout.flush_seconds
        self.num_cpus = num_cpus
        self.policy_version: int | None = None
        self._started_ray = False
        self._hosts: list[Any] = []
        self._model_actor: Any = None
        self._pool: Any = None  # the interception deployment (farm.interception = "serve")
        self._local_run: LocalRun | None = None  # a backend="local" run in progress
        self._closed = False
        self._streams: list[GroupStream] = []

    @property
    def is_local(self) -> bool:
        return self.config.backend == "local"

    def _validate_endpoint(self) -> None:
        m = self.config.model
        builtin = parse_scripted_model(m.name) or parse_local_model(m.name)
        if builtin is None and not m.base_url:
            raise ConfigError(
                f"model {m.name!r} needs a base_url (an OpenAI-compatible endpoint such as "
                "vLLM's http://host:8000/v1), or use a built-in 'scripted:<policy>' or "
                "'local:smollm2' model"
            )

    @property
    def plan(self) -> RolloutPlan:
        env = self.config.env
        return RolloutPlan(
            model=self.config.model.name,
            harness_id=env.harness.id,
            runtime_type=env.runtime.type,
            sampling=self.config.sampling.as_params(),
            limits=env.limits(),
            timeouts=env.timeouts,
            scoring_overrides=env.scoring,
        )

    # -- lifecycle ------------------------------------------------------------------------

    def _start(self) -> None:
        if self._closed:
            raise RuntimeError("this Farm is closed")
        if self._hosts or self.is_local:
            return
        import ray

        from actors import cluster
        from vfray.harness import check_compatibility
        from vfray.harnesses.registry import make_harness
        from vfray.runtimes.registry import preflight_runtime, runtime_class

        # Refuse a broken pairing here, before any actor exists.
        harness = make_harness(self.config.env.harness.id, dict(self.config.env.harness.options))
        check_compatibility(harness, runtime_class(self.config.env.runtime.type))
        runtime = self.config.env.runtime
        local_ray = not (self.config.address or os.environ.get("RAY_ADDRESS"))
        preflight_runtime(harness, runtime.type, runtime.options, boxes_here=local_ray)
        self._started_ray = cluster.connect(self.config.address, num_cpus=self.num_cpus)
        scripted = parse_scripted_model(self.config.model.name)
        if scripted is not None:
            self._model_actor = cluster.start_scripted_model(*scripted)
            base_url = ray.get(self._model_actor.url.remote())
        elif parse_local_model(self.config.model.name) is not None:
            self._model_actor = cluster.start_local_model(self.config.model.name)
            base_url = ray.get(self._model_actor.url.remote())
        else:
            base_url = self.config.model.base_url
        placement = cluster.host_placement(
            self.num_hosts, self.config.farm.hosts_per_node, self.config.farm.cpus_per_host
        )
        if self.config.farm.interception == "serve":
            from actors.interception_pool import start_pool

            self._pool = start_pool(
                base_url=base_url,
                model=self.config.model.name,
                sampling=self.config.sampling.as_params(),
                api_key_var=self.config.model.api_key_var,
                replicas=max(1, len(cluster.alive_nodes())),
                tunnel=self.config.farm.tunnel,
            )
        self._hosts = cluster.start_hosts(
            placement,
            self.plan,
            base_url=base_url,
            api_key_var=self.config.model.api_key_var,
            harness_options=dict(self.config.env.harness.options),
            runtime_options=self.config.runtime_options(),
            max_concurrency=self.host_concurrency,
            interception=self._pool,
            tunnel=self.config.farm.tunnel,
        )
        # Fail here, with the host's own error, when a host cannot come up.
        ray.get([h.url.remote() for h in self._hosts])
        if self.policy_version is not None:
            self.set_policy_version(self.policy_version)

    def close(self) -> None:
        """Cancel every rollout (tearing its sandbox down) and release the actors. Called on a
        stream's own event loop (leaving ``with Farm`` inside the training coroutine), the
        release waits until the stream's run has finished its clean-up on that loop."""
        if self._closed:
            return
        self._closed = True
        if self._local_run is not None and not self._streams:
            self._local_run.cancel()
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
        if not self._hosts and self._model_actor is None:
            return
        import ray

        with contextlib.suppress(Exception):
            ray.get([h.shutdown.remote() for h in self._hosts], timeout=120)
        if self._model_actor is not None:
            with contextlib.suppress(Exception):
                ray.get(self._model_actor.shutdown.remote(), timeout=30)
        for actor in [*self._hosts, self._model_actor]:
            if actor is not None:
                with contextlib.suppress(Exception):
                    ray.kill(actor)
        if self._pool is not None:
            from actors.interception_pool import stop_pool

            stop_pool(self._pool)
            self._pool = None
        self._hosts = []
        self._model_actor = None
        if self._started_ray:
            ray.shutdown()

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
        if self._local_run is not None:
            return [self._local_run.backend.stats()]
        if not self._hosts:
            return []
        import ray

        stats: list[dict[str, Any]] = ray.get([h.stats.remote() for h in self._hosts])
        return stats

    def set_policy_version(self, version: int | None) -> None:
        """Stamp ``version`` on every ModelCall from now on (RL: the trainer's step)."""
        self.policy_version = version
        if self._local_run is not None:
            self._local_run.backend.env.interception.app.policy_version = version
        if self._hosts:
            import ray

            ray.get([h.set_policy_version.remote(version) for h in self._hosts])

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
            )
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
        name = name or getattr(tasks, "name", None) or "tasks"
        run_dir, run_id = self._run_dir(name, resume)
        if on_run_dir is not None:
            on_run_dir(run_dir)
        resume_state = {}
        if resume is not None:
            # Imported only here: it reads Parquet (pyarrow), which a fresh run's start-up
            # does not need.
            from actors.resume import load_resume_state

            resume_state = load_resume_state(run_dir)
        plan = self._run_plan(run_id, rollouts_per_task, streaming=False)
        total = _known_length(tasks, rollouts_per_task)
        header = self._header(run_id, name, rollouts_per_task)
        async with self._backend(run_dir, header) as backend:
            driver = RunDriver(plan, backend, None, resume_state)
            async with live_progress(
                driver.progress, total, enabled=self.progress, baseline=Baseline.of(resume_state)
            ):
                await driver.run(self._checked(tasks, rollouts_per_task))
        from vfray.results import RunResult

        return RunResult(run_dir)

    def stream(
        self, tasks: Iterable[Task[Any]], rollouts_per_task: int = 2, *, name: str | None = None
    ) -> GroupStream:
        """Yield each task's scored group as soon as it finishes (for RL training loops), as an
        async iterator. Rows are also written to a run folder, as with :meth:`run`. Stopping
        early is clean: ``break`` and leave the ``with Farm`` block (or ``await
        stream.aclose()``); every box is torn down and the rows written so far are kept."""
        name = name or getattr(tasks, "name", None) or "tasks"

        async def produce(deliver: Callable[[EpisodeGroup], Awaitable[None]]) -> None:
            run_dir, run_id = self._run_dir(name, None)

            async def deliver_outcome(outcome: Any) -> None:
                if outcome.episode is not None:
                    await deliver(EpisodeGroup(outcome.episode))

            plan = self._run_plan(run_id, rollouts_per_task, streaming=True)
            header = self._header(run_id, name, rollouts_per_task)
            async with self._backend(run_dir, header) as backend:
                driver = RunDriver(plan, backend, deliver_outcome)
                await driver.run(self._checked(tasks, rollouts_per_task))

        if self._closed:
            raise RuntimeError("this Farm is closed")
        stream = GroupStream(produce)
        self._streams.append(stream)
        return stream

    def _run_plan(self, run_id: str, n: int, *, streaming: bool) -> RunPlan:
        return RunPlan(
            run_id=run_id,
            rollouts_per_task=n,
            max_concurrent=self.config.max_concurrent,
            max_retries=self.max_retries,
            scoring_overrides=dict(self.config.env.scoring),
            agent=AgentInfo(
                harness=self.config.env.harness.id,
                runtime=self.config.env.runtime.type,
                model=self.config.model.name,
                sampling=self.config.sampling.as_params(),
            ),
            keep_episodes=streaming,
            max_groups_in_flight=max(1, self.config.max_concurrent // n) if streaming else None,
            scoring_timeout=self.config.env.timeouts.scoring,
            retry=self.config.retry,
        )

    @contextlib.asynccontextmanager
    async def _backend(self, run_dir: Path, header: dict[str, Any]) -> AsyncIterator[RunBackend]:
        """The backend for one run; on the way out every buffered row is written (also when
        the run fails or is cancelled), then the run's own resources are released."""
        if self.is_local:
            async with self._local_backend(run_dir, header) as local:
                yield local
            return
        from actors import cluster
        from actors.backend import RayBackend

        self._start()
        sink = cluster.start_sink(str(run_dir), header, self.flush_rows, self.flush_seconds)
        backend = RayBackend(self._hosts, sink, cluster.placement_check())
        try:
            yield backend
        finally:
            await backend.close()

    @contextlib.asynccontextmanager
    async def _local_backend(
        self, run_dir: Path, header: dict[str, Any]
    ) -> AsyncIterator[RunBackend]:
        from vfray.local_backend import open_local_run

        if self._closed:
            raise RuntimeError("this Farm is closed")

        def make_sink() -> TraceSink:
            from actors.sink import TraceSink  # a plain class: used here without Ray

            return TraceSink(
                str(run_dir), header, flush_rows=self.flush_rows, flush_seconds=self.flush_seconds
            )

        async with open_local_run(
            self.config, run_dir, header, make_sink, self.policy_version
        ) as run:
            self._local_run = run
            try:
                yield run.backend
            finally:
                self._local_run = None

    def _checked(self, tasks: Iterable[Task[Any]], n: int) -> Iterator[Task[Any]]:
        """Validate each task class once, lazily (a group reward with n < 2 is refused), and
        for Ray let workers unpickle it even when its module only exists here."""
        seen: set[type] = set()
        for task in tasks:
            if not isinstance(task, Task):
                raise ConfigError(f"expected vfray Task objects, got {type(task).__name__}")
            if type(task) not in seen:
                validate_group_config(type(task), n)
                if not self.is_local:
                    from actors.shipping import ship_by_value

                    ship_by_value(type(task), type(task.data))
                seen.add(type(task))
            yield task


def _known_length(tasks: Iterable[Any], n: int) -> int | None:
    try:
        return len(tasks) * n  # type: ignore[arg-type]
    except Exception:  # a generator (TypeError) or an infinite taskset (TasksetError)
        return None
