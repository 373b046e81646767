"""The interception pool's replica: the Serve deployment's callable, one
:class:`~vfray.interception.InterceptionApp` and its own listener on the node, opening,
snapshotting and concluding sessions for the node's SandboxHosts
(:class:`~actors.interception_pool.ServeBroker`), and the records its answers travel in. Every
answer carries the replica's incarnation id, so that a broker tells a lost session from a slow
one."""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal, NamedTuple

import ray

from vfray.endpoints.serving import serve_in_loop
from vfray.errors import ConfigError
from vfray.interception import InterceptionApp, InterceptionSettings, Limits, Upstream
from vfray.owned_process import tune_owned_process
from vfray.runtimes.tunnels import TunnelKeeper, TunnelSettings
from vfray.trace import Trace

STOP_WATCH_S = 0.1
"""How often a replica looks whether a session a host waits on was stopped."""


def _keep_serve_grpc_off_the_network() -> None:
    """Give this replica's Serve "inter-deployment" gRPC server no port.

    Serve starts that server in every replica, bound to ``[::]`` (all interfaces; seen here as
    the only non-loopback listener of a serve-mode run), and it unpickles the request metadata
    and arguments of any caller that holds the cluster's token. The pool never uses it: its
    handles call replicas by reference (Ray actor calls on the node's own address, see
    :class:`~actors.interception_pool.ServeBroker`), so it is started with no address at all.
    Serve binds it through this one module global; a Ray whose Serve does otherwise is refused
    rather than exposed."""
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
        tune_owned_process()
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
        def conclude() -> Trace:
            self._stop_waiting(secret, None)
            return self.app.conclude(secret)

        return self._answer(node_id, incarnation, conclude)

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
        return self._answer(node_id, incarnation, lambda: self.app.snapshot(secret))

    def _answer(self, node_id: str, incarnation: str, read: Callable[[], Trace]) -> Concluded:
        """``read``'s trace of a session, when it is this replica's: "elsewhere" for another
        node's, "lost" for an earlier incarnation's or a session ``read`` does not know."""
        if node_id != self.node_id:
            return Concluded("elsewhere")
        if incarnation != self.incarnation:
            return Concluded("lost")
        try:
            return Concluded("ok", read())
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
