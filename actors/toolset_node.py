"""Shared toolsets on Ray: one ``ToolsetNode`` actor per node, owned by the farm (its driver),
holding that node's instance of each shared toolset and serving it over MCP on the node's
loopback; each SandboxHost binds its rollouts there (:class:`NodeTools`), and the boxes call
the actor's listener directly, through the same ``host_url`` bridge as the interception.

Why an actor and not a Serve deployment: a box must reach the one instance that holds its
rollout's binding, so Serve's HTTP proxy would only add a hop (``benchmarks/tools.py``: p50 per
call 9.8-14.5 ms through the proxy vs 1.3 ms on the actor's own listener, 26-49 vs 426-463
calls/s at c=16), and direct ingress into a replica is this actor with Serve's controller on top.
The actors start with the first task (of each task class) that has a shared host-side toolset,
so runs without one pay nothing; hard node affinity, because an instance on another node would
be a second one.
"""

from __future__ import annotations

import logging
import os
import uuid
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from vfray.owned_process import tune_owned_process
from vfray.tools.host import HostToolServer, SharedTools, host_server
from vfray.tools.toolset import Placement, Scope, Toolset, task_toolsets
from vfray.trace import ToolCall

log = logging.getLogger(__name__)


def node_actor_name(prefix: str, node_id: str) -> str:
    return f"{prefix}-{node_id}"


class ToolsetNode:
    """The node's shared toolsets: a :class:`HostToolServer` in this actor's event loop."""

    def __init__(self) -> None:
        tune_owned_process()
        self.server: HostToolServer | None = None

    def _server(self) -> HostToolServer:
        if self.server is None:
            # Created in the actor's loop (its lock belongs there). Loopback: only the node's
            # own boxes call it, through their runtime's bridge where they have no network.
            self.server = HostToolServer("127.0.0.1")
        return self.server

    async def bind_shared(self, toolset: Toolset) -> str:
        return await self._server().bind_shared(toolset)

    async def calls(self, url: str) -> list[ToolCall]:
        return await self._server().calls(url)

    async def unbind(self, url: str) -> None:
        await self._server().unbind(url)

    async def stats(self) -> dict[str, Any]:
        server = self._server()
        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "pid": os.getpid(),
            "bindings": len(server.bindings),
            "instances": {f"{k[0]}/{k[1]}": id(v) for k, v in server.shared.items()},
        }


class NodeTools:
    """A SandboxHost's way to its node's :class:`ToolsetNode` (:class:`SharedTools`), looked up
    by name. While the node has none (it joined after the actors were started, or the first
    task of each class that reached the farm had no shared toolset) the host serves shared
    toolsets from its own loop, as the local backend does, and looks again at the next bind."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._actor: Any = None
        self._warned = False
        self._own: dict[str, SharedTools] = {}
        """Bindings served by this host's own loop, by URL."""

    def _node_actor(self) -> Any:
        if self._actor is None:
            node = ray.get_runtime_context().get_node_id()
            try:
                self._actor = ray.get_actor(node_actor_name(self.prefix, node))
            except ValueError:
                if not self._warned:
                    log.warning("no ToolsetNode on node %s: this host serves shared toolsets", node)
                    self._warned = True
        return self._actor

    async def bind_shared(self, toolset: Toolset) -> str:
        actor = self._node_actor()
        if actor is None:
            own = host_server()
            url = await own.bind_shared(toolset)
            self._own[url] = own
            return url
        bound: str = await actor.bind_shared.remote(toolset)
        return bound

    async def calls(self, url: str) -> list[ToolCall]:
        own = self._own.get(url)
        if own is not None:
            return await own.calls(url)
        calls: list[ToolCall] = await self._actor.calls.remote(url)
        return calls

    async def unbind(self, url: str) -> None:
        own = self._own.pop(url, None)
        if own is not None:
            await own.unbind(url)
        else:
            await self._actor.unbind.remote(url)


def needs_node_tools(task: Any) -> bool:
    """Whether ``task`` has a shared toolset served on the host side (a failing
    ``toolsets()`` says no here: the rollout's setup reports it)."""
    try:
        sources = task_toolsets(task)
    except Exception:  # the rollout's setup raises it as a ToolError
        return False
    return any(
        isinstance(s, Toolset) and s.scope == Scope.SHARED and s.placement == Placement.HOST
        for s in sources
    )


class ToolsetNodes:
    """The farm's ``ToolsetNode`` actors, one per alive node, started on first need."""

    def __init__(self) -> None:
        self.prefix = f"vfray-tools-{uuid.uuid4().hex[:12]}"
        self.actors: list[Any] = []

    def ensure(self, nodes: list[str]) -> None:
        if self.actors:
            return
        actor_cls = ray.remote(ToolsetNode)
        for node in nodes:
            self.actors.append(
                actor_cls.options(
                    name=node_actor_name(self.prefix, node),
                    num_cpus=0,
                    max_concurrency=10_000,
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
                ).remote()
            )

    def stats(self) -> list[dict[str, Any]]:
        stats: list[dict[str, Any]] = ray.get([a.stats.remote() for a in self.actors])
        return stats

    def close(self) -> None:
        actors, self.actors = self.actors, []
        for actor in actors:
            try:
                ray.kill(actor)
            except Exception:  # already gone with its node
                log.debug("ToolsetNode already gone")
