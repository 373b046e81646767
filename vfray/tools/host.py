"""The host-side tool server: one MCP listener per event loop (a farm process, a SandboxHost),
serving every rollout's host-placed toolsets and the run's shared ones, each at its own token.

A per-rollout toolset is bound for one rollout and unbound with it; a shared toolset is one
instance per process, and each rollout gets its own binding (its own state and call log) on it.
The listener starts with the first binding and stops with the last.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import weakref

from vfray.tools._mcp_app import Binding, build_app
from vfray.tools.toolset import Toolset


class HostToolServer:
    """The MCP listener of one event loop, and its bindings by token."""

    def __init__(self) -> None:
        self.bindings: dict[str, Binding] = {}
        self.shared: dict[tuple[str, str], Toolset] = {}
        self.url: str | None = None
        self._stack: contextlib.AsyncExitStack | None = None
        self._lock = asyncio.Lock()

    def shared_instance(self, toolset: Toolset) -> Toolset:
        """The process's instance of a shared toolset (the first one seen serves the run)."""
        cls = type(toolset)
        key = (f"{cls.__module__}:{cls.__qualname__}", toolset.server_name())
        return self.shared.setdefault(key, toolset)

    async def bind(self, binding: Binding) -> str:
        """Serve ``binding``; returns its URL (on the host's loopback)."""
        async with self._lock:
            if self._stack is None:
                from vfray.serving import serve_in_loop

                stack = contextlib.AsyncExitStack()
                # The SDK's session manager runs in the app's lifespan.
                self.url = await stack.enter_async_context(
                    serve_in_loop(build_app(self.bindings.get), lifespan="on")
                )
                self._stack = stack
            token = secrets.token_urlsafe(16)
            self.bindings[token] = binding
        return f"{self.url}/mcp/{token}"

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


def host_server() -> HostToolServer:
    """This event loop's host tool server."""
    loop = asyncio.get_running_loop()
    server = _SERVERS.get(loop)
    if server is None:
        server = _SERVERS[loop] = HostToolServer()
    return server
