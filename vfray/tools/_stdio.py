"""An MCP server that speaks over stdio (``McpServer(command=...)``), run in the rollout's box
and answered through a host-side binding: JSON-RPC lines on its stdin and stdout."""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

from vfray.errors import ToolError
from vfray.runtimes.base import LiveProcess, Runtime

PROTOCOL_VERSION = "2025-06-18"


class StdioServer:
    """One stdio MCP program in a box; requests are serialized (one in flight at a time)."""

    def __init__(self, process: LiveProcess, name: str) -> None:
        self.process = process
        self.name = name
        self._ids = itertools.count(1)
        self._lock = asyncio.Lock()

    @classmethod
    async def start(
        cls, runtime: Runtime, name: str, argv: list[str], env: dict[str, str], timeout: float
    ) -> StdioServer:
        process = await runtime.open_process(argv, env=env)
        server = cls(process, name)
        try:
            await asyncio.wait_for(
                server.request(
                    "initialize",
                    {
                        "protocolVersion": PROTOCOL_VERSION,
                        "capabilities": {},
                        "clientInfo": {"name": "vfray", "version": "0"},
                    },
                ),
                timeout,
            )
            await server.notify("notifications/initialized")
        except (TimeoutError, ToolError, OSError) as exc:
            await process.stop(0.5)
            raise ToolError(f"tool server {name!r} ({argv[0]}) did not start: {exc}") from None
        return server

    async def notify(self, method: str) -> None:
        self.process.stdin.write(json.dumps({"jsonrpc": "2.0", "method": method}).encode() + b"\n")
        await self.process.stdin.drain()

    async def request(self, method: str, params: dict[str, Any] | None = None) -> Any:
        async with self._lock:
            rid = next(self._ids)
            body = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params or {}}
            self.process.stdin.write(json.dumps(body).encode() + b"\n")
            await self.process.stdin.drain()
            while True:
                line = await self.process.stdout.readline()
                if not line:
                    raise ToolError(f"tool server {self.name!r} exited")
                try:
                    reply = json.loads(line)
                except ValueError:
                    continue  # a log line on stdout
                if isinstance(reply, dict) and reply.get("id") == rid:
                    break
        if "error" in reply:
            raise ToolError(f"tool server {self.name!r}: {reply['error']}")
        return reply.get("result")

    async def list_tools(self) -> list[dict[str, Any]]:
        result = await self.request("tools/list")
        return list(result.get("tools", []))

    async def call(self, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        result = await self.request("tools/call", {"name": name, "arguments": arguments})
        text = "\n".join(
            str(part.get("text", ""))
            for part in result.get("content", [])
            if isinstance(part, dict)
        )
        return text, bool(result.get("isError"))

    async def close(self) -> None:
        await self.process.stop(1.0)
