"""Answering an agent's call from its :class:`~vfray.interception.exchange.Exchange`: the
upstream's status, headers and body, and for an SSE stream the relayed chunks with keepalive
comments while the model is silent."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from starlette.responses import Response, StreamingResponse

from vfray.interception.exchange import Exchange
from vfray.interception.turns import JSON_HEADERS

KEEPALIVE = b": keepalive\n\n"
"""An SSE comment: every SSE parser skips it, every idle-timeout between here and the agent
(a proxy, the SDK's read timeout) sees bytes."""


async def respond(exchange: Exchange, keepalive: float = 0.0) -> Response:
    status, headers = await exchange.head()
    if headers.get("content-type") == "text/event-stream":
        chunks = exchange.iter_chunks()
        if keepalive > 0:
            chunks = _with_keepalives(chunks, keepalive)
        return StreamingResponse(chunks, status_code=status, headers=headers)
    return Response(await exchange.body(), status_code=status, headers=headers or JSON_HEADERS)


async def _with_keepalives(chunks: AsyncIterator[bytes], every: float) -> AsyncIterator[bytes]:
    """``chunks``, with :data:`KEEPALIVE` after each ``every`` seconds without one. The relay
    pushes whole SSE events, so a comment between two pushes never splits an event."""
    source = aiter(chunks)
    pending: asyncio.Future[bytes] = asyncio.ensure_future(anext(source))
    try:
        while True:
            done, _ = await asyncio.wait({pending}, timeout=every)
            if not done:
                yield KEEPALIVE
                continue
            try:
                chunk = pending.result()
            except StopAsyncIteration:
                return
            yield chunk
            pending = asyncio.ensure_future(anext(source))
    finally:
        pending.cancel()
