"""The interception as a Ray Serve deployment (``farm.interception = "serve"``):
``farm.interception_replicas_per_node`` replicas on each node (default one), each serving
:class:`~vfray.interception.InterceptionApp` on a listener of its own on the node (direct
ingress: Serve's HTTP proxy measured ~10 ms p50 here, uvicorn in an actor ~0.5 ms; the replica
is :mod:`actors._interception_replica`), and the broker through which a node's SandboxHosts open
and close sessions with their node's replica over a Serve handle. Serve owns the replicas'
placement, health and restarts.

A box talks to one replica's listener directly, so every call for a session must reach the
replica that opened it: the deployment's router (:mod:`actors._pinned_router`) sends a call
that names a replica to that one, and each broker pins itself to one of its node's replicas
(its host's ``slot`` on the node picks which, so a node's hosts are spread over its replicas).

A replica's sessions die with it. The broker tells that apart from a slow answer: every replica
has an incarnation id, a session is concluded only by the incarnation that opened it, and a
session whose replica is gone comes back as an :class:`~vfray.errors.InterceptionError` — which
the driver retries, keeping the lost attempt as its own row.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import ray

from actors._interception_replica import Concluded, Endpoint, InterceptionReplica, Registration
from vfray.errors import InterceptionError
from vfray.interception import InterceptionSettings, Limits
from vfray.runtimes.tunnels import TunnelSettings
from vfray.trace import StopCondition, Trace

log = logging.getLogger(__name__)

DEPLOYMENT = "Interception"
REPLICA_WAIT_S = 60.0
"""How long a broker waits for its node's replica to (re)appear before a session is refused."""
_RETRY_PAUSE_S = 0.2


@dataclass(frozen=True)
class PoolRef:
    """What a SandboxHost needs to reach the pool: the Serve application's name."""

    app_name: str
    per_node: int = 1
    """Replicas on each node."""


def start_pool(
    *,
    base_url: str,
    model: str,
    sampling: Mapping[str, Any],
    api_key_var: str | None,
    replicas: int,
    per_node: int = 1,
    tunnel: TunnelSettings | None = None,
    settings: InterceptionSettings | None = None,
) -> PoolRef:
    """Deploy the pool as its own Serve application (Serve started without an HTTP proxy when
    it is not running yet): ``replicas`` replicas, at most ``per_node`` on a node."""
    from ray import serve
    from ray.serve.config import ProxyLocation, RequestRouterConfig

    from actors._pinned_router import PinnedRouter

    serve.start(proxy_location=ProxyLocation.Disabled)
    name = f"vfray-interception-{uuid.uuid4().hex[:8]}"
    deployment = serve.deployment(
        name=DEPLOYMENT,
        num_replicas=replicas,
        max_replicas_per_node=per_node,
        # The class itself, not its path: Serve pickles it for the handles (a class is what
        # its field takes, whatever the pydantic stub says).
        request_router_config=RequestRouterConfig(
            request_router_class=PinnedRouter  # type: ignore[arg-type]
        ),
        # Session calls are tiny; a replica must never look "full" to the router, or a call
        # would be sent to another node's replica.
        max_ongoing_requests=100_000,
        ray_actor_options={"num_cpus": 0},
        health_check_period_s=2,
    )(InterceptionReplica)
    app = deployment.bind(
        base_url, model, dict(sampling), api_key_var, tunnel=tunnel, settings=settings
    )
    serve.run(app, name=name, route_prefix=None, blocking=False)
    return PoolRef(name, per_node)


def stop_pool(pool: PoolRef) -> None:
    from ray import serve

    with contextlib.suppress(Exception):
        serve.delete(pool.app_name, _blocking=True)


class ServeBroker:
    """A SandboxHost's :class:`~vfray.rollout.SessionBroker` for one replica on its node: the
    ``slot``-th (see :class:`~actors._pinned_router.PinnedRouter`) when it first asks, then
    that one until it is gone."""

    def __init__(self, pool: PoolRef, *, remote: bool = False, slot: int = 0) -> None:
        from ray import serve

        self.node_id: str = ray.get_runtime_context().get_node_id()
        handle = serve.get_deployment_handle(DEPLOYMENT, pool.app_name)
        # Its node's replicas first (Serve's private switch; its proxies route the same way).
        handle._init(_prefer_local_routing=True)  # type: ignore[no-untyped-call]
        # By reference (Ray actor calls), never by value over the replica's gRPC server, which
        # has no address (:func:`_keep_serve_grpc_off_the_network`) whatever
        # RAY_SERVE_USE_GRPC_BY_DEFAULT says.
        self.handle = handle.options(_by_reference=True)
        self.per_node = pool.per_node
        self.slot = slot
        self.policy_version: int | None = None
        self.remote = remote
        """The run's boxes are off the node: sessions get the node tunnel's URL."""
        self._pinned: str | None = None
        """The replica (Serve's unique id) this broker is pinned to; None: not chosen yet."""
        self._endpoint: Endpoint | None = None
        """The pinned replica's own (local) endpoint, as last seen."""
        # Live sessions by secret: the replica incarnation (and its URL) that opened each.
        self._opened: dict[str, Registration] = {}
        self._watches: dict[str, asyncio.Future[None]] = {}
        """Per live session, the call that waits for the replica to stop it."""

    def _route(self, replica: str | None = None) -> dict[str, Any]:
        if replica is not None:
            return {"replica": replica}
        if self._pinned is not None:
            return {"replica": self._pinned}
        return {"slot": self.slot, "per_node": self.per_node}

    async def _ask(self, method: str, *args: Any, route: dict[str, Any] | None = None) -> Any:
        """Call ``method`` until this node's replica answers (not None / not elsewhere), or
        raise InterceptionError after :data:`REPLICA_WAIT_S`."""
        deadline = time.monotonic() + REPLICA_WAIT_S
        while True:
            failure = ""
            try:
                call = getattr(self.handle, method)
                answer = await call.remote(self.node_id, *args, **(route or self._route()))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the replica died under the call, or is not up yet
                answer = None
                failure = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            if answer is not None and getattr(answer, "status", None) != "elsewhere":
                return answer
            if time.monotonic() > deadline:
                raise InterceptionError(
                    f"no interception replica answered on this node for {REPLICA_WAIT_S:g}s"
                    + (f" ({failure})" if failure else "")
                )
            await asyncio.sleep(_RETRY_PAUSE_S)

    async def url(self) -> str:
        """The pinned replica's endpoint (``.../v1``) as last seen; each session is handed the
        URL of the replica that opened it (:meth:`endpoint`)."""
        if self._endpoint is None:
            found: Endpoint = await self._ask("endpoint")
            self._endpoint, self._pinned = found, found.replica
        return self._endpoint.url

    async def public_url(self) -> str:
        """The pinned replica's endpoint through the node's tunnel (opened on first need), as
        a box off the node reaches it."""
        found: Endpoint = await self._ask("endpoint", True)
        self._pin(found.replica)
        return found.url

    def _pin(self, replica: str) -> None:
        if replica != self._pinned:
            # Pinned on first use, or the pinned replica is gone and another one answered:
            # this host's sessions go to that one from now on.
            self._pinned = replica
            if self._endpoint is not None and self._endpoint.replica != replica:
                self._endpoint = None

    async def register(
        self,
        trace: Trace,
        limits: Limits,
        stop_check: Callable[[Trace], Awaitable[str | None]] | None,
        sampling: Mapping[str, Any] | None,
    ) -> str:
        reg: Registration = await self._ask(
            "register", trace, limits, stop_check, sampling, self.policy_version, self.remote
        )
        self._pin(reg.replica)
        self._opened[reg.secret] = reg
        self._watches[reg.secret] = asyncio.ensure_future(self._watch_stop(reg, trace))
        return reg.secret

    async def _watch_stop(self, reg: Registration, trace: Trace) -> None:
        """Bring the replica's refusal to ``trace``, the rollout's own, which its segments
        watch (in host mode the interception records into it directly): the program is then
        stopped as promptly as there."""
        with contextlib.suppress(Exception):
            condition = await self.handle.wait_stopped.remote(
                self.node_id, reg.incarnation, reg.secret, **self._route(reg.replica)
            )
            if condition is not None:
                trace.stop(StopCondition(condition))

    def endpoint(self, secret: str) -> str | None:
        reg = self._opened.get(secret)
        return reg.url if reg is not None else None

    async def conclude(self, secret: str) -> Trace:
        watch = self._watches.pop(secret, None)
        if watch is not None:
            watch.cancel()
        reg = self._opened.pop(secret, None)
        if reg is None:
            raise KeyError("unknown session")
        done: Concluded = await self._ask(
            "conclude", reg.incarnation, secret, route=self._route(reg.replica)
        )
        if done.trace is None:
            raise InterceptionError(
                "the node's interception replica died and took this rollout's session with it"
            )
        return done.trace

    async def snapshot(self, secret: str) -> Trace:
        reg = self._opened.get(secret)
        if reg is None:
            raise KeyError("unknown session")
        seen: Concluded = await self._ask(
            "snapshot", reg.incarnation, secret, route=self._route(reg.replica)
        )
        if seen.trace is None:
            raise InterceptionError(
                "the node's interception replica died and took this rollout's session with it"
            )
        return seen.trace

    async def set_policy_version(self, version: int | None) -> None:
        self.policy_version = version
        with contextlib.suppress(InterceptionError):
            await self._ask("set_policy_version", version)

    @property
    def replica(self) -> str | None:
        """The replica this broker is pinned to (Serve's unique id), once chosen."""
        return self._pinned

    @property
    def session_count(self) -> int:
        return len(self._opened)
