"""The host-side tool server: one MCP listener per event loop (a farm process, a SandboxHost),
serving every rollout's host-placed toolsets at its own token, and the seam through which
rollouts reach the run's shared toolsets (:func:`shared_tools`).

A per-rollout toolset is bound for one rollout and unbound with it. A shared toolset is one
instance per run on the local backend (this loop's server holds it) and one per node on Ray
(the node's ``ToolsetNode`` actor holds it, installed on each SandboxHost's loop by
:func:`use_shared_tools`); either way each rollout gets its own binding (its own state and call
log) on it. The listener starts with the first binding and stops with the last.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import weakref
from typing import Protocol

from vfray.tools._mcp_app import Binding, build_app
from vfray.tools.toolset import Toolset
from vfray.trace import ToolCall


class SharedTools(Protocol):
    """Where a rollout's binding on a shared toolset lives: this loop's server, or a node's."""

    async def bind_shared(self, toolset: Toolset) -> str:
        """Bind one rollout on the run's instance of ``toolset``'s class; returns its URL."""
        ...

    async def calls(self, url: str) -> list[ToolCall]:
        """The calls recorded on that binding so far."""
        ...

    async def unbind(self, url: str) -> None: ...


class HostToolServer:
    """The MCP listener of one event loop, and its bindings by token."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.bindings: dict[str, Binding] = {}
        self.shared: dict[tuple[str, str], Toolset] = {}
        self.url: str | None = None
        self._stack: contextlib.AsyncExitStack | None = None
        self._lock = asyncio.Lock()

    def shared_instance(self, toolset: Toolset) -> Toolset:
        """This server's instance of a shared toolset (the first one seen serves the run)."""
        cls = type(toolset)
        key = (f"{cls.__module__}:{cls.__qualname__}", toolset.server_name())
        return self.shared.setdefault(key, toolset)

    async def bind(self, binding: Binding) -> str:
        """Serve ``binding``; returns its URL (on the host's loopback)."""
        async with self._lock:
            if self._stack is None:
                from vfray.endpoints.serving import serve_in_loop

                stack = contextlib.AsyncExitStack()
                # The SDK's session manager runs in the app's lifespan.
                self.url = await stack.enter_async_context(
                    serve_in_loop(build_app(self.bindings.get), host=self.host, lifespan="on")
                )
                self._stack = stack
            token = secrets.token_urlsafe(16)
            self.bindings[token] = binding
        return f"{self.url}/mcp/{token}"

    async def bind_shared(self, toolset: Toolset) -> str:
        instance = self.shared_instance(toolset)
        return await self.bind(Binding(server=instance.server_name(), toolset=instance))

    async def calls(self, url: str) -> list[ToolCall]:
        binding = self.bindings.get(url.rsplit("/", 1)[-1])
        return list(binding.calls) if binding is not None else []

    async def unbind(self, url: str) -> None:
        token = url.rsplit("/", 1)[-1]
        async with self._lock:
            self.bindings.pop(token, None)
            if not self.bindings and self._stack is not None:
                stack, self._stack, self.url = self._stack, None, None
                await stack.aclose()


_SERVERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, HostToolServer] = (
    weakref.WeakKeyDictionary()
)
_SHARED: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, SharedTools] = (
    weakref.WeakKeyDictionary()
)


def host_server() -> HostToolServer:
    """This event loop's host tool server."""
    loop = asyncio.get_running_loop()
    server = _SERVERS.get(loop)
    if server is None:
        server = _SERVERS[loop] = HostToolServer()
    return server


def use_shared_tools(shared: SharedTools | None) -> None:
    """Serve this loop's rollouts' shared toolsets from ``shared`` (None: from this loop's own
    server again). A SandboxHost installs its node's actor here once, so a rollout never asks
    which backend it runs on."""
    loop = asyncio.get_running_loop()
    if shared is None:
        _SHARED.pop(loop, None)
    else:
        _SHARED[loop] = shared


def shared_tools() -> SharedTools:
    """Where this loop's rollouts bind shared toolsets."""
    return _SHARED.get(asyncio.get_running_loop()) or host_server()
