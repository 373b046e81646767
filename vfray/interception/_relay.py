"""Answering an agent's call from its :class:`~vfray.interception.exchange.Exchange`: the
upstream's status, headers and body, and for an SSE stream the relayed chunks with keepalive
comments while the model is silent."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from vfray.interception.exchange import Exchange
from vfray.interception.turns import JSON_HEADERS

KEEPALIVE = b": keepalive\n\n"
"""An SSE comment: every SSE parser skips it, every idle-timeout between here and the agent
(a proxy, the SDK's read timeout) sees bytes."""


async def respond(exchange: Exchange, keepalive: float = 0.0) -> Response:
    status, headers = await exchange.head()
    if headers.get("content-type") == "text/event-stream":
        return _Stream(exchange.iter_chunks(keepalive, KEEPALIVE), status, headers)
    return Response(await exchange.body(), status_code=status, headers=headers or JSON_HEADERS)


class _Stream(Response):
    """An SSE answer: Starlette's ``StreamingResponse`` on an ASGI 2.3 server (uvicorn), with
    one watcher task for the client's disconnect instead of an anyio task group of two (a
    streamed call's largest cost of its own in the interception, after the socket writes)."""

    def __init__(self, chunks: AsyncIterator[bytes], status: int, headers: dict[str, str]) -> None:
        self.chunks = chunks
        self.status_code = status
        self.background = None
        self.raw_headers = [
            (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        task = asyncio.current_task()
        assert task is not None
        gone = False

        async def watch() -> None:
            nonlocal gone
            message: Message = await receive()
            while message["type"] != "http.disconnect":
                message = await receive()
            # The client hung up: stop relaying to it (the upstream call and its recording go
            # on in their own task).
            gone = True
            task.cancel()

        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        watcher = asyncio.ensure_future(watch())
        try:
            async for chunk in self.chunks:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not gone or task.uncancel() > 0:
                raise  # cancelled by the server's shutdown, not by the watcher
        finally:
            watcher.cancel()
