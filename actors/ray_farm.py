"""The farm-lifetime backend on Ray (:class:`~vfray.run.backends.FarmBackend`): connects to Ray
(a local one on loopback when no address is given), starts the built-in model actor, the
interception deployment (``farm.interception = "serve"``) and the SandboxHosts once, and opens
each run over them with a TraceSink actor of its own."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import ray

from actors import cluster
from actors.backend import RayBackend
from actors.interception_pool import PoolRef, start_pool, stop_pool
from actors.sandbox_host import LateUrl
from actors.shipping import ship_by_value
from actors.toolset_node import ToolsetNodes, needs_node_tools
from vfray.errors import VfrayError
from vfray.run.spec import RunSpec
from vfray.task import Task


class RayFarm:
    """SandboxHost actors (and the built-in model's actor) for the farm's lifetime."""

    def __init__(self, spec: RunSpec) -> None:
        self.spec = spec
        self.policy_version: int | None = None
        self.hosts: list[Any] = []
        self.model_actor: Any = None
        self.pool: PoolRef | None = None
        """The interception deployment (``farm.interception = "serve"``)."""
        self.toolset_nodes = ToolsetNodes()
        """The per-node shared-toolset actors, started by the first task that needs them."""
        self._started_ray = False

    def start(self) -> None:
        if self.hosts:
            return
        spec = self.spec
        # Boxes start on this machine only with a Ray of our own; a cluster's nodes have their
        # own engines, which this machine's say nothing about.
        local_ray = not (spec.address or os.environ.get("RAY_ADDRESS"))
        spec.preflight(boxes_here=local_ray)
        self._started_ray = cluster.connect(spec.address, num_cpus=spec.concurrency.num_cpus)
        endpoint = spec.endpoint
        model_url: Any = None  # the built-in model actor's URL, as it will be
        # Named: the hosts find it by name (LateUrl), also when Ray restarts one of them.
        model_name = f"vfray-model-{uuid.uuid4().hex[:12]}"
        if endpoint.kind == "scripted":
            assert endpoint.scripted_policy is not None
            self.model_actor = cluster.start_scripted_model(
                endpoint.scripted_policy, dict(endpoint.scripted_options), model_name
            )
            model_url = self.model_actor.url.remote()
        elif endpoint.kind == "local":
            self.model_actor = cluster.start_local_model(endpoint.model, model_name)
            model_url = self.model_actor.url.remote()
        # The hosts start while the model actor does (each is a worker process to start and an
        # import of vfray: seconds before a first rollout); a host reads the URL when it is up.
        if model_url is None:
            assert endpoint.base_url is not None, "a remote endpoint has a base URL"
            base_url: str | LateUrl = endpoint.base_url
        else:
            base_url = LateUrl(model_name)
        layout = spec.config.farm
        placement = cluster.host_placement(
            spec.concurrency.hosts, layout.hosts_per_node, layout.cpus_per_host
        )
        if layout.interception == "serve":
            self.pool = start_pool(
                base_url=base_url if isinstance(base_url, str) else base_url.get(),
                model=endpoint.model,
                sampling=spec.plan.sampling,
                api_key_var=endpoint.api_key_var,
                replicas=max(1, len(cluster.alive_nodes())) * layout.interception_replicas_per_node,
                per_node=layout.interception_replicas_per_node,
                tunnel=layout.tunnel,
                settings=spec.config.interception,
            )
        hosts = cluster.HostLayout(
            placement,
            spec.plan,
            base_url=base_url,
            api_key_var=endpoint.api_key_var,
            harness_options=spec.harness_config.model_dump(),
            runtime_options=spec.runtime_options.as_kwargs(),
            max_concurrency=spec.concurrency.host_concurrency,
            interception=self.pool,
            tunnel=layout.tunnel,
            tools_prefix=self.toolset_nodes.prefix,
            interception_settings=spec.config.interception,
        )
        self.hosts = hosts.start_all()
        # Fail here, with the model actor's or the host's own error, when one cannot come up;
        # the model's first: the hosts waiting on its URL fail of it too.
        if model_url is not None:
            try:
                ray.get(model_url)
            except ray.exceptions.RayActorError as exc:
                raise VfrayError(
                    f"the built-in model actor ({endpoint.model}) could not "
                    f"start: {_last_line(exc)}"
                ) from None
        try:
            ray.get([h.url.remote() for h in self.hosts])
        except ray.exceptions.ActorDiedError as exc:
            # A harness or runtime the host cannot build: its own error, in one line.
            raise cluster.creation_error(exc) from None
        self.hosts = hosts.settle(self.hosts)
        if self.policy_version is not None:
            self.set_policy_version(self.policy_version)

    @contextlib.asynccontextmanager
    async def open_run(self, run_dir: Path, header: dict[str, Any]) -> AsyncIterator[RayBackend]:
        self.start()
        concurrency = self.spec.concurrency
        sink = cluster.start_sink(
            str(run_dir), header, concurrency.flush_rows, concurrency.flush_seconds
        )
        backend = RayBackend(self.hosts, sink, cluster.host_placement_of(self.hosts))
        try:
            yield backend
        finally:
            await backend.close()

    def prepare(self, task: Task[Any]) -> None:
        # Let workers unpickle the task even when its module only exists here.
        ship_by_value(type(task), type(task.data))
        if needs_node_tools(task):
            self.start()
            self.toolset_nodes.ensure([n["NodeID"] for n in cluster.alive_nodes()])

    def stats(self) -> list[dict[str, Any]]:
        if not self.hosts:
            return []
        stats: list[dict[str, Any]] = ray.get([h.stats.remote() for h in self.hosts])
        return stats

    def set_policy_version(self, version: int | None) -> None:
        self.policy_version = version
        if self.hosts:
            ray.get([h.set_policy_version.remote(version) for h in self.hosts])

    def interrupt(self) -> None:
        pass  # close() shuts the hosts down, which cancels their rollouts

    def close(self) -> None:
        if not self.hosts and self.model_actor is None and self.pool is None:
            return
        with contextlib.suppress(Exception):
            ray.get([h.shutdown.remote() for h in self.hosts], timeout=120)
        if self.model_actor is not None:
            with contextlib.suppress(Exception):
                ray.get(self.model_actor.shutdown.remote(), timeout=30)
        for actor in [*self.hosts, self.model_actor]:
            if actor is not None:
                with contextlib.suppress(Exception):
                    ray.kill(actor)
        self.toolset_nodes.close()
        if self.pool is not None:
            stop_pool(self.pool)
            self.pool = None
        self.hosts = []
        self.model_actor = None
        if self._started_ray:
            ray.shutdown()


def _last_line(exc: BaseException) -> str:
    """An actor's creation error as one line: the last of Ray's message, which is the original
    exception (``RuntimeError: ...``) after its traceback."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__
