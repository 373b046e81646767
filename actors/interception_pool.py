"""The interception as a Ray Serve deployment (``farm.interception = "serve"``):
``farm.interception_replicas_per_node`` replicas on each node (default one), each serving
:class:`~vfray.interception.InterceptionApp` on a listener of its own on the node (direct
ingress: Serve's HTTP proxy measured ~10 ms p50 here, uvicorn in an actor ~0.5 ms), and the
broker through which a node's SandboxHosts open and close sessions with their node's
replica over a Serve handle. Serve owns the replicas' placement, health and restarts.

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
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import ray

from vfray.endpoints.serving import serve_in_loop
from vfray.errors import ConfigError, InterceptionError
from vfray.interception import InterceptionApp, InterceptionSettings, Limits, Upstream
from vfray.runtimes.tunnels import TunnelKeeper, TunnelSettings
from vfray.trace import StopCondition, Trace

log = logging.getLogger(__name__)

DEPLOYMENT = "Interception"
REPLICA_WAIT_S = 60.0
"""How long a broker waits for its node's replica to (re)appear before a session is refused."""
_RETRY_PAUSE_S = 0.2
STOP_WATCH_S = 0.1
"""How often a replica looks whether a session a host waits on was stopped."""


def _keep_serve_grpc_off_the_network() -> None:
    """Give this replica's Serve "inter-deployment" gRPC server no port.

    Serve starts that server in every replica, bound to ``[::]`` (all interfaces; seen here as
    the only non-loopback listener of a serve-mode run), and it unpickles the request metadata
    and arguments of any caller that holds the cluster's token. The pool never uses it: its
    handles call replicas by reference (Ray actor calls on the node's own address, see
    :class:`ServeBroker`), so it is started with no address at all. Serve binds it through
    this one module global; a Ray whose Serve does otherwise is refused rather than exposed."""
    from ray.serve._private import replica as serve_replica

    if not hasattr(serve_replica, "add_port_to_grpc_server"):
        raise ConfigError(
            "this Ray's Serve binds its replicas' gRPC server in a way vfray cannot keep off "
            "the network; use farm.interception = 'host'"
        )

    def no_address(server: Any, address: str) -> int:
        del server, address
        return 0  # a port number Serve records and never dials (handles go by reference)

    setattr(serve_replica, "add_port_to_grpc_server", no_address)  # noqa: B010


@dataclass(frozen=True)
class PoolRef:
    """What a SandboxHost needs to reach the pool: the Serve application's name."""

    app_name: str
    per_node: int = 1
    """Replicas on each node."""


class Registration(NamedTuple):
    secret: str
    url: str
    incarnation: str
    replica: str
    """The replica's unique id in Serve (what :class:`PinnedRouter` routes by)."""


class Endpoint(NamedTuple):
    url: str
    incarnation: str
    replica: str


class Concluded(NamedTuple):
    status: Literal["ok", "elsewhere", "lost"]
    """``elsewhere``: the call reached another node's replica (ask again); ``lost``: the replica
    that held the session is gone."""
    trace: Trace | None = None


class InterceptionReplica:
    """The deployment's callable: one interception app and its listener, in a Serve replica."""

    # Serve awaits an async constructor (so the listener is up before the replica is ready).
    async def __init__(  # type: ignore[misc]
        self,
        base_url: str,
        model: str,
        sampling: Mapping[str, Any],
        api_key_var: str | None = None,
        bind_host: str = "127.0.0.1",
        tunnel: TunnelSettings | None = None,
        settings: InterceptionSettings | None = None,
    ) -> None:
        # The key is read here, on the replica's node, so it never travels through the driver.
        api_key = os.environ.get(api_key_var) if api_key_var else None
        if api_key_var and api_key is None:
            raise ConfigError(
                f"environment variable {api_key_var} (the API key) is not set on the node of "
                "an interception replica"
            )
        # ``sampling`` is not imposed here: each rollout's session imposes the plan's (once).
        del sampling
        self.app = InterceptionApp(
            Upstream(base_url=base_url, api_key=api_key, model=model), settings=settings
        )
        # Before Serve's own start-up (which runs after this constructor) opens its listener.
        _keep_serve_grpc_off_the_network()
        from ray import serve

        self.node_id: str = ray.get_runtime_context().get_node_id()
        self.incarnation = uuid.uuid4().hex
        self.replica_id: str = serve.get_replica_context().replica_id.unique_id
        self.opened = 0
        """Sessions this replica has opened."""
        self._waiting: dict[str, tuple[Trace, asyncio.Future[str | None]]] = {}
        """Sessions whose host waits to hear of their stop (:meth:`wait_stopped`)."""
        self._watcher: asyncio.Future[None] | None = None
        self._stack = contextlib.AsyncExitStack()
        # Loopback by default, as the in-host app: boxes on the node reach it directly or through
        # their runtime's unix-socket bridge, boxes elsewhere through the node's tunnel.
        root = await self._stack.enter_async_context(
            serve_in_loop(self.app, bind_host, 0, timeout_keep_alive=600)
        )
        self.url = root + "/v1"
        # The node's one tunnel for boxes off the node, opened by the first one's session.
        self.tunnel = TunnelKeeper(tunnel or TunnelSettings(), self.url)

    # Every method takes the router's keywords (``replica``, ``slot``, ``per_node``: see
    # :class:`PinnedRouter`); Serve passes them on to the call.

    async def endpoint(self, node_id: str, remote: bool = False, **route: Any) -> Endpoint | None:
        """This replica's URL (the node tunnel's for a ``remote`` box) when it is on
        ``node_id``, else None."""
        if node_id != self.node_id:
            return None
        url = await self.tunnel.public_url(self.url) if remote else self.url
        return Endpoint(url, self.incarnation, self.replica_id)

    async def register(
        self,
        node_id: str,
        trace: Trace,
        limits: Limits,
        stop_check: Callable[[Trace], Awaitable[str | None]] | None,
        sampling: Mapping[str, Any] | None,
        policy_version: int | None,
        remote: bool = False,
        **route: Any,
    ) -> Registration | None:
        """Open a session; None when this replica is not on ``node_id`` (nothing opened).
        A ``remote`` box (off the node) is handed the URL of the node's tunnel."""
        if node_id != self.node_id:
            return None
        url = await self.tunnel.public_url(self.url) if remote else self.url
        self.app.policy_version = policy_version
        secret = self.app.register(
            trace, limits, stop_check, dict(sampling) if sampling is not None else None
        )
        self.opened += 1
        return Registration(secret, url, self.incarnation, self.replica_id)

    async def conclude(
        self, node_id: str, incarnation: str, secret: str, **route: Any
    ) -> Concluded:
        if node_id != self.node_id:
            return Concluded("elsewhere")
        if incarnation != self.incarnation:
            return Concluded("lost")
        self._stop_waiting(secret, None)
        try:
            return Concluded("ok", self.app.conclude(secret))
        except KeyError:
            return Concluded("lost")

    async def wait_stopped(
        self, node_id: str, incarnation: str, secret: str, **route: Any
    ) -> str | None:
        """Answers once the session is stopped (a refused call: a limit, a stop hook), with its
        stop condition; None when it is concluded first, is unknown, or is not this one's.

        The host's rollout watches its own trace for a refusal, which here is recorded in this
        replica's copy; without this answer the agent ran on until it quit by itself
        (mini-swe-agent: 5-21 s of retries, against 0.5 s in host mode)."""
        if node_id != self.node_id or incarnation != self.incarnation:
            return None
        try:
            trace = self.app.snapshot(secret)
        except KeyError:
            return None
        if trace.stop_condition is not None:
            return trace.stop_condition.value
        done: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        self._waiting[secret] = (trace, done)
        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.ensure_future(self._watch())
        try:
            return await done
        finally:
            waiting = self._waiting.get(secret)
            if waiting is not None and waiting[1] is done:  # the caller went away
                del self._waiting[secret]

    async def _watch(self) -> None:
        """One loop for every waiting session: a look at each trace every
        :data:`STOP_WATCH_S` (a few microseconds per session), ending when none waits."""
        while self._waiting:
            await asyncio.sleep(STOP_WATCH_S)
            for secret, (trace, _) in list(self._waiting.items()):
                if trace.stop_condition is not None:
                    self._stop_waiting(secret, trace.stop_condition.value)

    def _stop_waiting(self, secret: str, answer: str | None) -> None:
        waiting = self._waiting.pop(secret, None)
        if waiting is not None and not waiting[1].done():
            waiting[1].set_result(answer)

    async def snapshot(
        self, node_id: str, incarnation: str, secret: str, **route: Any
    ) -> Concluded:
        """The live session's trace so far (a copy reaches the caller), for its task's user."""
        if node_id != self.node_id:
            return Concluded("elsewhere")
        if incarnation != self.incarnation:
            return Concluded("lost")
        try:
            return Concluded("ok", self.app.snapshot(secret))
        except KeyError:
            return Concluded("lost")

    async def set_policy_version(
        self, node_id: str, version: int | None, **route: Any
    ) -> bool | None:
        if node_id != self.node_id:
            return None
        self.app.policy_version = version
        return True

    async def stats(self, **route: Any) -> dict[str, Any]:
        return {
            "node_id": self.node_id,
            "pid": os.getpid(),
            "incarnation": self.incarnation,
            "replica": self.replica_id,
            "sessions": self.app.session_count,
            "opened": self.opened,
            "url": self.url,
            "tunnels_opened": self.tunnel.opened,
        }

    async def check_health(self) -> None:
        """Serve restarts a replica whose listener stopped."""
        if self.app.closing:
            raise RuntimeError("the interception listener is closed")

    async def __del__(self) -> None:
        await self.tunnel.close()
        self.app.closing = True
        await self._stack.aclose()
        await self.app.aclose()


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
