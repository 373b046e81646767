"""One rollout's tool servers: started in its setup phase (a failure is a ``ToolError`` that
fails the setup), handed to the harness as ``{name: url}`` as seen from the box, their calls
collected onto the trace after the agent, and stopped before the box is.

Placement decides the way in: a host-placed toolset is a binding on this process's
:class:`~vfray.tools.host.HostToolServer`, a shared one a binding on the run's instance
(:func:`~vfray.tools.host.shared_tools`: this loop's server, or on Ray the node's actor), both
reached through ``Runtime.host_url`` (the bridge the interception uses under default-deny
egress); a box-placed one runs in the box (``Runtime.run_background``) and is reached on the
box's loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import Sequence

from vfray.errors import SandboxError, ToolError
from vfray.runtimes.base import BackgroundProcess, Runtime
from vfray.tools._mcp_app import Binding
from vfray.tools._stdio import StdioServer
from vfray.tools.host import SharedTools, host_server, shared_tools
from vfray.tools.toolset import McpServer, Placement, Scope, Toolset, ToolSource
from vfray.trace import ToolCall

TOOLS_DIR = ".vfray/tools"
"""Folder (relative to the box's work dir) for in-box servers' pickles and call logs."""
READY_LINE = "vfray-tools listening on "


def _box_pythonpath() -> str:
    """The host's import path, for an in-box server in a box over the host's filesystem
    (subprocess, bwrap): vfray, the SDK and the toolset's module import from there."""
    return os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))


class RolloutTools:
    """The tool servers of one rollout."""

    def __init__(
        self, sources: Sequence[ToolSource], runtime: Runtime, start_timeout: float = 30.0
    ) -> None:
        self.sources = list(sources)
        self.runtime = runtime
        self.start_timeout = start_timeout
        self.urls: dict[str, str] = {}
        """Server name -> MCP URL as the box sees it."""
        self.routes: list[str] = []
        """The host URLs the box must keep reaching under default-deny egress."""
        self._bindings: list[tuple[str, Binding]] = []
        self._shared: list[tuple[SharedTools, str]] = []
        self._in_box: list[tuple[str, BackgroundProcess]] = []
        self._stdio: list[StdioServer] = []

    async def start(self) -> dict[str, str]:
        """Start every server; a :class:`ToolError` names the one that failed."""
        try:
            for source in self.sources:
                if isinstance(source, McpServer):
                    await self._start_external(source)
                elif source.placement == Placement.BOX:
                    await self._start_in_box(source)
                else:
                    await self._bind_host(source)
        except ToolError:
            raise
        except (SandboxError, OSError) as exc:
            raise ToolError(f"a tool server did not start: {exc}") from exc
        return dict(self.urls)

    async def _publish(self, name: str, host_url: str) -> None:
        url = await self.runtime.host_url(host_url)
        self.urls[name] = url
        self.routes.append(url)

    async def _bind_host(self, toolset: Toolset) -> None:
        name = toolset.server_name()
        if toolset.scope == Scope.SHARED:
            shared = shared_tools()
            url = await shared.bind_shared(toolset)
            self._shared.append((shared, url))
        else:
            binding = Binding(server=name, toolset=toolset)
            url = await host_server().bind(binding)
            self._bindings.append((url, binding))
        await self._publish(name, url)

    async def _start_in_box(self, toolset: Toolset) -> None:
        name = toolset.server_name()
        if toolset.scope == Scope.SHARED:
            raise ToolError(f"toolset {name!r} is shared: it cannot run inside one rollout's box")
        spec, log = f"{TOOLS_DIR}/{name}.pkl", f"{TOOLS_DIR}/{name}.calls.jsonl"
        try:
            # cloudpickle, not pickle: on Ray the toolset's class may have come to this host by
            # value (actors.shipping), and pickle refuses a class that is not its module's own
            # object; cloudpickle then sends it by value too (by reference when importable).
            import cloudpickle

            payload = cloudpickle.dumps(toolset)
        except Exception as exc:
            raise ToolError(f"toolset {name!r} cannot be pickled into the box: {exc}") from exc
        await self.runtime.write(spec, payload)
        await self.runtime.write(log, b"")
        argv = [self.runtime.python, "-m", "vfray.tools._box", spec, log]
        process = await self.runtime.run_background(argv, env={"PYTHONPATH": _box_pythonpath()})
        self._in_box.append((log, process))
        deadline = time.monotonic() + self.start_timeout
        while READY_LINE not in process.stdout:
            if process.returncode is not None or time.monotonic() > deadline:
                why = (
                    f"exited with {process.returncode}"
                    if process.returncode is not None
                    else f"not listening after {self.start_timeout:g}s"
                )
                tail = process.stderr.strip()[-1500:]
                raise ToolError(
                    f"in-box tool server {name!r} did not start ({why})"
                    + (f":\n{tail}" if tail else "")
                )
            await asyncio.sleep(0.02)
        port = int(process.stdout.split(READY_LINE, 1)[1].split()[0])
        loopback = f"http://127.0.0.1:{port}"
        # Where every program of the box shares one loopback (subprocess, a container, bwrap
        # sharing the network) the agent calls the server there. A bwrap box without network
        # gives each program a namespace of its own: the agent then reaches the server's port
        # through the host, by the box's own expose and bridge.
        seen = await self.runtime.expose(port)
        if seen.rstrip("/") == loopback:
            self.urls[name] = f"{loopback}/mcp/box"
        else:
            await self._publish(name, f"{seen.rstrip('/')}/mcp/box")

    async def _start_external(self, server: McpServer) -> None:
        if server.url is not None:
            self.urls[server.name] = server.url
            return
        assert server.command is not None
        stdio = await StdioServer.start(
            self.runtime, server.name, list(server.command), dict(server.env), server.start_timeout
        )
        self._stdio.append(stdio)
        binding = Binding(
            server=server.name,
            forward=stdio.call,
            list_tools=stdio.list_tools,
            call_timeout=server.call_timeout,
        )
        url = await host_server().bind(binding)
        self._bindings.append((url, binding))
        await self._publish(server.name, url)

    async def collect(self) -> list[ToolCall]:
        """Every call recorded so far, in start order (in-box logs read from the box)."""
        calls = [c for _, b in self._bindings for c in b.calls]
        for shared, url in self._shared:
            try:
                calls.extend(await shared.calls(url))
            except Exception:  # a lost node server loses its calls, not the trace
                continue
        for log, _ in self._in_box:
            try:
                raw = await self.runtime.read(log)
            except (SandboxError, OSError):
                continue
            for line in raw.decode("utf-8", "replace").splitlines():
                with contextlib.suppress(ValueError):
                    calls.append(ToolCall.model_validate(json.loads(line)))
        return sorted(calls, key=lambda c: c.started_at)

    async def close(self) -> None:
        """Unbind the host bindings and stop the servers in the box (idempotent)."""
        server = host_server()
        bindings, self._bindings = self._bindings, []
        for url, _ in bindings:
            await server.unbind(url)
        shared, self._shared = self._shared, []
        for where, url in shared:
            with contextlib.suppress(Exception):
                await where.unbind(url)
        stdio, self._stdio = self._stdio, []
        in_box, self._in_box = self._in_box, []
        await asyncio.gather(
            *(s.close() for s in stdio),
            *(p.stop(1.0) for _, p in in_box),
            return_exceptions=True,
        )


async def start_tools(task: object, runtime: Runtime) -> RolloutTools | None:
    """Start ``task``'s tool servers for one rollout (None when it has none); on failure the
    ones already started are stopped and a :class:`ToolError` raised."""
    from vfray.tools.toolset import task_toolsets

    try:
        sources = task_toolsets(task)
    except Exception as exc:
        raise ToolError(f"the task's toolsets() failed: {type(exc).__name__}: {exc}") from exc
    if not sources:
        return None
    tools = RolloutTools(sources, runtime)
    try:
        await tools.start()
    except BaseException:
        await tools.close()
        raise
    return tools
