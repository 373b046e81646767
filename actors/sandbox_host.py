"""The SandboxHost actor: an async Ray actor that owns many runtimes at once and runs the
rollout state machine for each, with the node's interception endpoint served in-process.

Why the interception lives in the host rather than in a separate Ray Serve replica: every
session's register/conclude then is a function call instead of an RPC, and a host's crash takes
its sessions and its rollouts down together, so turns are never lost silently — the driver sees
the actor die and retries those rollouts elsewhere. With the default of one host per node this is
exactly "one endpoint per node shared by all its rollouts". Serve's own HTTP proxy measured
~10 ms p50 here versus ~0.5 ms for uvicorn in an actor, so direct ingress is the default anyway.
With ``farm.interception = "serve"`` the host instead opens its sessions with its node's replica
of the interception deployment (:mod:`actors.interception_pool`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import ray

from actors.interception_pool import PoolRef, ServeBroker
from actors.toolset_node import NodeTools
from vfray.endpoints.client import Target
from vfray.endpoints.serving import close_abandoning, serve_in_loop
from vfray.errors import ConfigError
from vfray.harnesses.base import killed_from_outside
from vfray.harnesses.registry import make_harness
from vfray.harnesses.seats import SeatedTask
from vfray.interception import InterceptionApp, InterceptionSettings, Upstream
from vfray.owned_process import tune_owned_process
from vfray.rollout import RolloutPlan, run_planned_rollout
from vfray.run.broker import InProcessBroker
from vfray.run.environment import open_endpoint
from vfray.run.outcomes import (
    EpisodeJob,
    EpisodeOutcome,
    RolloutJob,
    RolloutOutcome,
    finish_episode,
)
from vfray.run.seating import Station, Stations, play_game
from vfray.runtimes.bwrap import release_warm_boxes
from vfray.runtimes.registry import runtime_class
from vfray.runtimes.tunnels import TunnelKeeper, TunnelSettings
from vfray.tools.host import use_shared_tools
from vfray.trace import Trace

if TYPE_CHECKING:
    from vfray.traces.wire import PackedRows


KILLED_PROGRAM_HOLD_S = 5.0
"""How long a rollout whose harness program was SIGKILLed from outside waits before it answers:
well past the ~0.5 s Ray's force-kill takes from killing the actor's children to its exit."""


@dataclass(frozen=True)
class LateUrl:
    """The URL of the built-in model actor, which may still be starting, by the actor's name:
    the host asks it in ``__init__`` (again when Ray restarts the host elsewhere).

    A name, not the actor's handle or its ``url()`` ObjectRef: Ray keeps creation arguments
    holding either in the object store, logs a red ``ERROR … has constructor arguments in the
    object store and max_restarts > 0`` for every host (ray#53727), and a host restarted after
    the ref was released died of it."""

    actor: str

    def get(self) -> str:
        model: Any = ray.get_actor(self.actor)
        url: str = ray.get(model.url.remote())
        return url


class SandboxHost:
    """Runs rollouts; created with ``ray.remote(SandboxHost).options(max_concurrency=...)``."""

    def __init__(
        self,
        plan: RolloutPlan,
        *,
        base_url: str | LateUrl,
        api_key_var: str | None = None,
        harness_options: dict[str, Any] | None = None,
        runtime_options: dict[str, Any] | None = None,
        bind_host: str | None = None,
        interception: PoolRef | None = None,
        tunnel: TunnelSettings | None = None,
        slot: int = 0,
        tools_prefix: str | None = None,
        interception_settings: InterceptionSettings | None = None,
    ) -> None:
        """``slot``: this host's index among the hosts on its node; with the Serve pool it
        picks the node's replica (:class:`~actors.interception_pool.ServeBroker`).
        ``tools_prefix``: the name prefix of the farm's per-node shared-toolset actors."""
        tune_owned_process()
        self.plan = plan
        if isinstance(base_url, LateUrl):  # the built-in model actor, started beside this host
            base_url = base_url.get()
        # The key is read here, on the host's node, so it never travels through the driver (the
        # host needs it with the Serve pool too: users and judges call the model from here).
        api_key = os.environ.get(api_key_var) if api_key_var else None
        if api_key_var and api_key is None:
            raise ConfigError(
                f"environment variable {api_key_var} (the API key) is not set on the node of "
                "a SandboxHost"
            )
        # Where the rollouts' simulated users and judges call by default: the run's endpoint.
        self.model_target = Target(base_url, plan.model, api_key)
        # With the Serve pool the node's replica holds the upstream; the host has no app then.
        self.app: InterceptionApp | None = None
        if interception is None:
            # No sampling here: each rollout's session imposes the plan's sampling (once).
            self.app = InterceptionApp(
                Upstream(base_url=base_url, api_key=api_key, model=plan.model),
                settings=interception_settings,
            )
        self.harness = make_harness(plan.harness_id, dict(harness_options or {}))
        self.runtime_options = dict(runtime_options or {})
        # Loopback: boxes reach the endpoint on their own node (directly, or through the
        # runtime's unix-socket bridge); nothing off the node has to, so nothing off it can.
        self.bind_host = bind_host or "127.0.0.1"
        # Boxes off the node reach the interception through the node's tunnel: the replica's
        # with Serve, else this host's own (opened by its first remote box).
        self.remote = runtime_class(plan.runtime_type).REMOTE
        self.tunnel_settings = tunnel or TunnelSettings()
        self.tunnel: TunnelKeeper | None = None
        self.broker = (
            ServeBroker(interception, remote=self.remote, slot=slot)
            if interception is not None
            else None
        )
        self._stack = contextlib.AsyncExitStack()
        self._url: str | None = None
        self._lock = asyncio.Lock()
        self._in_flight: dict[str, asyncio.Future[Trace | list[Trace]]] = {}
        self._seating: Stations | None = None
        self.completed = 0
        self.tools_prefix = tools_prefix
        self._tools_installed = False

    async def url(self) -> str:
        """The interception endpoint (``.../v1``), started on first use."""
        if self.broker is not None:
            return await self.broker.url()
        async with self._lock:
            if self._url is None:
                base = await self._stack.enter_async_context(
                    serve_in_loop(self._own_app(), host=self.bind_host)
                )
                self._url = base + "/v1"
                self.tunnel = TunnelKeeper(self.tunnel_settings, self._url)
            return self._url

    async def run_rollout(self, rollout: RolloutJob) -> tuple[RolloutOutcome, Trace | list[Trace]]:
        """Run one rollout (a game of a seated task: one trace per seat); returns a small
        outcome (for the driver) and the trace(s) (for the episode task) as two Ray objects
        when called with ``num_returns=2``."""
        url = await self.url()
        if self.tools_prefix is not None and not self._tools_installed:
            # Shared toolsets bind on the node's ToolsetNode, not on this host's own loop.
            use_shared_tools(NodeTools(self.tools_prefix))
            self._tools_installed = True
        if self.remote:
            # Known before the box starts (a runtime may fix its network policy then): the
            # node tunnel's URL, this host's own or its pinned replica's.
            if self.tunnel is not None:
                url = await self.tunnel.public_url(url)
            elif self.broker is not None:
                url = await self.broker.public_url()
        ids: dict[str, Any] = {
            "rollout_index": rollout.index,
            "attempt": rollout.attempt,
            "run_id": rollout.run_id,
            "episode_id": rollout.episode_id,
        }
        broker = self.broker or InProcessBroker(self._own_app())
        job: asyncio.Future[Trace | list[Trace]]
        if isinstance(rollout.task, SeatedTask):
            if self._seating is None:
                # Seats that name their own model get an endpoint and interception here, in the
                # host, on first use, closed with the host; also with the Serve pool, whose
                # replicas serve only the run's model (see :mod:`vfray.run.seating`).
                default = Station(self.plan, self.harness, self.runtime_options, broker, url)
                self._seating = Stations(default, open_endpoint)
                self._seating.set_policy_version(self._policy_version())
                self._stack.push_async_callback(self._seating.aclose)
            job = asyncio.ensure_future(play_game(rollout.task, self._seating, **ids))
        else:
            job = asyncio.ensure_future(
                run_planned_rollout(
                    rollout.task,
                    plan=self.plan,
                    harness=self.harness,
                    runtime_options=self.runtime_options,
                    broker=broker,
                    interception_url=url,
                    model_target=self.model_target,
                    **ids,
                )
            )
        key = f"{rollout.task.key}/{rollout.index}/{rollout.attempt}/{time.monotonic_ns()}"
        self._in_flight[key] = job
        try:
            done = await job
        finally:
            self._in_flight.pop(key, None)
        self.completed += 1
        traces = done if isinstance(done, list) else [done]
        if any(killed_from_outside(e) for t in traces for e in t.errors):
            # Ray's force-kill of this actor SIGKILLs its direct children (the harness programs)
            # first, then flushes metrics before it exits (core_worker_shutdown_executor.cc):
            # answered in that gap, a rollout the host's death cut short would end as a failure
            # of its harness, kept as final, instead of lost with the host and retried. Held a
            # moment, the answer dies with the host; any other killer costs only the moment.
            await asyncio.sleep(KILLED_PROGRAM_HOLD_S)
        if isinstance(done, list):
            return RolloutOutcome.of_game(done), done
        return RolloutOutcome.of(done), done

    async def finish_episode(
        self, job: EpisodeJob, *traces: Trace | list[Trace]
    ) -> tuple[EpisodeOutcome, PackedRows]:
        """Score one task's group and build its rows (for the sink, as IPC bytes: see
        :mod:`vfray.traces.wire`), in this loop as the local backend does: call with
        ``num_returns=2``; Ray resolves the rollouts' refs first."""
        # Imported here: pyarrow is not needed before the first episode is scored (a host's
        # start delays the first rollout).
        from vfray.traces.wire import pack_rows

        outcome, rows = await finish_episode(job, list(traces))
        return outcome, pack_rows(rows)

    def _policy_version(self) -> int | None:
        return (
            self.broker.policy_version
            if self.broker is not None
            else self._own_app().policy_version
        )

    def _own_app(self) -> InterceptionApp:
        assert self.app is not None, "a host with the Serve pool has no app of its own"
        return self.app

    async def set_policy_version(self, version: int | None) -> None:
        if self._seating is not None:
            self._seating.set_policy_version(version)
        if self.broker is not None:
            await self.broker.set_policy_version(version)
        else:
            self._own_app().policy_version = version

    async def stats(self) -> dict[str, Any]:
        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "pid": os.getpid(),
            "in_flight": len(self._in_flight),
            "completed": self.completed,
            "sessions": (self.broker or self._own_app()).session_count,
            "url": self._url if self.broker is None else await self.broker.url(),
            "replica": self.broker.replica if self.broker is not None else None,
        }

    async def shutdown(self) -> int:
        """Cancel every rollout (each tears its sandbox down), stop the endpoint and let the
        warm boxes go."""
        jobs = list(self._in_flight.values())
        for job in jobs:
            job.cancel()
        if jobs:
            await asyncio.gather(*jobs, return_exceptions=True)
        if self.tunnel is not None:
            await self.tunnel.close()
        if jobs:
            # Their calls still in flight have no rollout left to answer: not waited for.
            await close_abandoning(self._stack)
        else:
            await self._stack.aclose()
        if self.app is not None:
            with contextlib.suppress(Exception):
                now = asyncio.get_running_loop().time()
                await self.app.aclose(now if jobs else None)
        self._url = None
        # The boxes the rollouts parked warm: the farm kills this actor next, which runs no
        # atexit; the lifeline's watchdog would reap them then, but only once the actor is gone.
        await release_warm_boxes()
        return len(jobs)
