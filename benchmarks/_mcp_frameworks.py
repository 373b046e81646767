"""A one-tool MCP server (``fine(x) -> 2x``) built with a given framework, for the framework
comparison in ``benchmarks/tools.py``: ``python _mcp_frameworks.py {lowlevel,mcpserver,fastmcp}``
prints ``port N`` once it listens on 127.0.0.1 at ``/mcp``. Imports nothing from vfray, so the
standalone ``fastmcp`` package can run it from a virtualenv of its own."""

from __future__ import annotations

import asyncio
import socket
import sys
from typing import Any


def _app(kind: str) -> Any:
    if kind == "lowlevel":
        # The SDK's low-level Server bare: what vfray's app builds on, without its routing
        # by token, argument validation and call recording.
        import mcp_types as types
        from mcp.server.lowlevel.server import Server
        from mcp.server.transport_security import TransportSecuritySettings

        tool = {
            "name": "fine",
            "description": "Doubles x.",
            "inputSchema": {"type": "object", "properties": {"x": {"type": "integer"}}},
        }

        async def on_list(ctx: Any, params: Any) -> Any:
            return types.ListToolsResult.model_validate({"tools": [tool]})

        async def on_call(ctx: Any, params: Any) -> Any:
            text = str(2 * int((params.arguments or {}).get("x", 1)))
            return types.CallToolResult(content=[types.TextContent(type="text", text=text)])

        low: Any = Server("bench", on_list_tools=on_list, on_call_tool=on_call)
        return low.streamable_http_app(
            stateless_http=True,
            json_response=True,
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )
    if kind == "mcpserver":
        # The official SDK's decorator server (FastMCP until mcp 2.0 renamed it).
        from mcp.server.mcpserver import MCPServer
        from mcp.server.transport_security import TransportSecuritySettings

        server: Any = MCPServer("bench")

        @server.tool()
        def fine(x: int = 1) -> str:
            """Doubles x."""
            return str(2 * x)

        return server.streamable_http_app(
            stateless_http=True,
            json_response=True,
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )
    if kind == "fastmcp":
        from fastmcp import FastMCP

        fast: Any = FastMCP("bench")

        @fast.tool
        def fine(x: int = 1) -> str:
            """Doubles x."""
            return str(2 * x)

        return fast.http_app(path="/mcp", stateless_http=True, json_response=True)
    raise SystemExit(f"unknown framework {kind!r}")


async def _serve(kind: str) -> None:
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(_app(kind), log_level="warning", lifespan="on"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    print(f"port {sock.getsockname()[1]}", flush=True)
    await task


if __name__ == "__main__":
    import logging

    logging.disable(logging.INFO)  # both log a line per stateless request at INFO
    asyncio.run(_serve(sys.argv[1]))
