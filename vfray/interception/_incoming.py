"""Reading a client's request body under the size cap and the stall timeout, answering
refusals, and refusing JSON that is not valid Unicode: the interception's client-input plumbing.

An answer sent before the body was read (401, 413) is written at once, then the rest of the
body is read and dropped before the response ends: a client that writes its whole request
before reading (``urllib``, with ``Connection: close``) then reads the answer instead of a reset.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from typing import Any

from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse
from starlette.types import Receive, Scope, Send

from vfray.interception._client_json import WORTH_FROM_BYTES, ClientJson, read_object

DRAIN_BYTES = 64 * 1024 * 1024
"""At most this much of a refused body is read and dropped; past it the connection may reset."""
DRAIN_SECONDS = 30.0

# A \uD800-\uDFFF escape; a lone one (no pair) decodes to a str that cannot be encoded as UTF-8.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


class RequestError(Exception):
    """A call answered with an error status; ``client_input`` when the body itself is at fault
    (malformed, oversized), which is noted on the rollout's trace."""

    def __init__(
        self, status: int, message: str, *, client_input: bool = False, final: bool = False
    ) -> None:
        super().__init__(message)
        self.status = status
        self.client_input = client_input
        self.final = final
        """No retry can change the answer: sent with the dialect's ``final_status`` and
        ``x-should-retry: false`` (the Stainless SDKs honour it), so agents end at once."""


class Incoming:
    """The request body as it is read, so an early answer knows whether any is left to drain.

    ``stall_timeout``: seconds :meth:`read` waits for the next piece of the body; a body that
    stops midway is answered 408 (and its connection closed) instead of holding the call."""

    def __init__(self, receive: Receive, stall_timeout: float | None = None) -> None:
        self._receive = receive
        self.stall_timeout = stall_timeout
        self.done = False
        self.stalled = False
        """The body stopped midway: nothing is left to drain, the connection is closed."""

    async def chunk(self, timeout: float | None = None) -> bytes:
        try:
            # asyncio.timeout, not wait_for: no task per chunk on the proxy's hot path.
            async with asyncio.timeout(timeout):
                message = await self._receive()
        except TimeoutError:
            self.stalled = True
            reason = f"the request body stalled: no bytes for {timeout:g} s"
            raise RequestError(408, reason, client_input=True) from None
        if message["type"] == "http.disconnect":
            self.done = True
            raise ClientDisconnect()
        self.done = not message.get("more_body", False)
        body: bytes = message.get("body", b"")
        return body

    async def read(self, declared: str | None, limit: int) -> bytes:
        """The whole body; :class:`RequestError` 413 past ``limit`` bytes (declared or sent)."""
        if declared is not None:
            try:
                size = int(declared)
            except ValueError:
                message = "invalid Content-Length header"
                raise RequestError(400, message, client_input=True) from None
            if size > limit:
                raise RequestError(413, too_large(limit), client_input=True)
        chunks = []
        received = 0
        while not self.done:
            chunk = await self.chunk(self.stall_timeout)
            received += len(chunk)
            if received > limit:
                raise RequestError(413, too_large(limit), client_input=True)
            chunks.append(chunk)
        return b"".join(chunks)

    async def drain(self) -> None:
        """Read and drop what is left of the body (bounded in bytes and time)."""

        async def drop() -> None:
            dropped = 0
            while not self.done and dropped <= DRAIN_BYTES:
                dropped += len(await self.chunk())

        with contextlib.suppress(ClientDisconnect, TimeoutError):
            await asyncio.wait_for(drop(), DRAIN_SECONDS)


def too_large(limit: int) -> str:
    return f"request body exceeds the {limit}-byte limit"


class ErrorResponse(JSONResponse):
    """An error answer that drains the unread rest of the request body before it ends."""

    def __init__(self, content: Any, status_code: int, incoming: Incoming | None) -> None:
        super().__init__(content, status_code)
        self.incoming = incoming

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.incoming is not None and self.incoming.stalled:
            # Nothing more is coming on this connection: answer and let the server close it.
            self.headers["connection"] = "close"
        if self.incoming is None or self.incoming.done or self.incoming.stalled:
            await super().__call__(scope, receive, send)
            return
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        await send({"type": "http.response.body", "body": self.body, "more_body": True})
        await self.incoming.drain()
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def parse_json(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object; :class:`RequestError` 400 for anything else. For a body that
    is read, not forwarded (a token count): no member's text is kept."""
    return parse_json_kept(raw, keep=False)[0]


def parse_json_kept(raw: bytes, *, keep: bool = True) -> tuple[dict[str, Any], ClientJson | None]:
    """:func:`parse_json`, with its members' text kept where the body is a plain object
    (:mod:`vfray.interception._client_json`), for forwarding it without writing it again."""
    read = read_object(raw) if keep and len(raw) >= WORTH_FROM_BYTES else None
    if read is not None:
        body, kept = read
    else:
        kept = None
        try:
            body = json.loads(raw)
        except RecursionError:
            message = "malformed JSON body: nested too deeply"
            raise RequestError(400, message, client_input=True) from None
        except ValueError as exc:
            raise RequestError(400, f"malformed JSON body: {exc}", client_input=True) from None
    if not isinstance(body, dict):
        message = f"the body must be a JSON object, not {type(body).__name__}"
        raise RequestError(400, message, client_input=True)
    if _SURROGATE_ESCAPE.search(raw) is not None:
        # Rare (most clients send UTF-8, or escape only whole pairs): check exactly.
        try:
            json.dumps(body, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as exc:
            bad = exc.object[exc.start : exc.end].encode("unicode_escape").decode()
            message = f"malformed JSON body: a string holds a lone UTF-16 surrogate ({bad})"
            raise RequestError(400, message, client_input=True) from None
    return body, kept
