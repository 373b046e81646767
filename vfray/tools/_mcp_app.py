"""The MCP streamable-HTTP app that serves toolsets: one listener, many rollouts, each reaching
its own :class:`Binding` at ``/mcp/<token>``; every call is recorded as a ``ToolCall``.

Built on the official SDK's low-level ``Server`` in stateless JSON mode: each POST is one
JSON-RPC exchange, so the in-box stdlib client stays small and a shared server keeps no
per-connection state (the rollout's state lives on its binding).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from vfray.tools.toolset import ToolFailed, Toolset
from vfray.trace import ErrorInfo, ToolCall

Forward = Callable[[str, dict[str, Any]], Awaitable[tuple[str, bool]]]
"""A tool call passed on to another server: ``(name, arguments) -> (text, is_error)``."""
ListTools = Callable[[], Awaitable[list[dict[str, Any]]]]


@dataclass
class Binding:
    """One rollout's view of one tool server: the toolset (or a forwarder), its state, and the
    calls recorded so far."""

    server: str
    toolset: Toolset | None = None
    forward: Forward | None = None
    list_tools: ListTools | None = None
    call_timeout: float = 60.0
    state: dict[str, Any] = field(default_factory=dict)
    calls: list[ToolCall] = field(default_factory=list)
    on_call: Callable[[ToolCall], None] | None = None


def _error(message: str) -> ErrorInfo:
    return ErrorInfo(type="ToolError", message=message)


async def run_call(binding: Binding, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
    """Run one call on ``binding``, record it, and return what the agent gets back."""
    started = time.time()
    result: str | None = None
    original: str | None = None
    error: ErrorInfo | None = None
    is_error = False
    toolset = binding.toolset
    try:
        if toolset is not None:
            result = await toolset.call(name, arguments, binding.state)
            if len(result) > toolset.max_result_chars:
                size = len(result)
                result = None
                raise ToolFailed(
                    f"tool {name!r} returned {size} characters, over the limit of "
                    f"{toolset.max_result_chars}"
                )
            rewritten = toolset.intercept_result(name, arguments, result)
            if rewritten is not None:
                original, result = result, rewritten
        else:
            assert binding.forward is not None
            result, is_error = await asyncio.wait_for(
                binding.forward(name, arguments), binding.call_timeout
            )
    except ToolFailed as exc:
        error, result, is_error = _error(str(exc)), str(exc), True
    except TimeoutError:
        limit = toolset.call_timeout if toolset is not None else binding.call_timeout
        message = f"tool {name!r} timed out after {limit:g}s"
        error, result, is_error = _error(message), message, True
    except Exception as exc:
        message = f"tool {name!r} raised {type(exc).__name__}: {exc}"
        error, result, is_error = _error(message), message, True
    call = ToolCall(
        server=binding.server,
        name=name,
        arguments=arguments,
        result=result,
        original_result=original,
        error=error,
        started_at=started,
        ended_at=time.time(),
    )
    binding.calls.append(call)
    if binding.on_call is not None:
        binding.on_call(call)
    return result or "", is_error


async def list_tools(binding: Binding) -> list[dict[str, Any]]:
    if binding.toolset is not None:
        return [spec.as_mcp() for spec in binding.toolset.specs().values()]
    assert binding.list_tools is not None
    return await binding.list_tools()


def build_app(lookup: Callable[[str], Binding | None], *, max_body: int = 4 << 20) -> Any:
    """The ASGI app: ``/mcp/<token>`` is the MCP endpoint of ``lookup(token)``'s binding (404
    for an unknown or ended one)."""
    from vfray.errors import optional_import

    optional_import("mcp", "tools")
    import mcp_types as types
    from mcp.server.lowlevel.server import Server
    from mcp.server.transport_security import TransportSecuritySettings

    def binding_of(ctx: Any) -> Binding:
        token = ctx.request.scope.get("vfray_token") if ctx.request is not None else None
        binding = lookup(token) if token else None
        if binding is None:
            raise ValueError("no such tool session")
        return binding

    async def on_list(ctx: Any, params: Any) -> Any:
        tools = await list_tools(binding_of(ctx))
        return types.ListToolsResult.model_validate({"tools": tools})

    async def on_call(ctx: Any, params: Any) -> Any:
        text, is_error = await run_call(binding_of(ctx), params.name, dict(params.arguments or {}))
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=text)], is_error=is_error
        )

    server: Server[Any] = Server("vfray-tools", on_list_tools=on_list, on_call_tool=on_call)
    # Boxes reach it by many names (loopback, a bridge, a tunnel): the token is the access
    # control, so the SDK's Host/Origin checks (made for browsers on localhost) are off.
    inner = server.streamable_http_app(
        stateless_http=True,
        json_response=True,
        max_request_body_size=max_body,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await inner(scope, receive, send)
            return
        parts = scope["path"].strip("/").split("/")
        if len(parts) != 2 or parts[0] != "mcp" or lookup(parts[1]) is None:
            body = json.dumps({"error": "no such tool session"}).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 404,
                    "headers": [(b"content-type", b"application/json")],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        scope = {**scope, "path": "/mcp", "raw_path": b"/mcp", "vfray_token": parts[1]}
        await inner(scope, receive, send)

    return app
