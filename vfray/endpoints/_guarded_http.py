"""uvicorn's httptools protocol with bounds on each request's head: its size, its number of
header lines, and the time from its first byte to its last header (slowloris).

A refused head is answered (431 too large, 408 too slow) and the connection is closed after a
short linger that reads and discards, so a client still writing sees the answer, not a reset.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, ClassVar

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

_LINGER_S = 2.0
"""How long a refused connection keeps reading (and discarding) before it closes."""

_REASONS = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}


@dataclass(frozen=True)
class HeadLimits:
    """Bounds on one request's head (request line plus headers)."""

    max_bytes: int = 64 * 1024
    max_headers: int = 128
    timeout: float = 5.0
    """Seconds from a request's first byte to the end of its headers. An idle connection (no
    byte of a next request yet) is governed by uvicorn's keep-alive timeout instead."""


class _Refused(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


def guarded_protocol(limits: HeadLimits) -> type[asyncio.Protocol]:
    """A protocol class for ``uvicorn.Config(http=...)`` enforcing ``limits``."""
    return type("GuardedHttpToolsProtocol", (GuardedHttpToolsProtocol,), {"limits": limits})


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    limits: ClassVar[HeadLimits] = HeadLimits()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = False
        self._head_bytes = 0  # as parsed: request target, header names and values
        self._head_raw = 0  # as received: whole chunks that arrived inside one head
        self._head_count = 0
        self._head_timer: asyncio.TimerHandle | None = None
        self._refused = False

    # -- connection ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # uvicorn arms its keep-alive timer only after a response: without this a connection
        # that never sends a byte would be held forever.
        self.timeout_keep_alive_task = self.loop.call_later(
            self.timeout_keep_alive, self.timeout_keep_alive_handler
        )

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # lingering: read and discard
        was_in_head = self._in_head
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            if isinstance(exc.__context__, _Refused):
                self._refuse(exc.__context__.status)
            else:
                self._invalid()
        except httptools.HttpParserError:
            self._invalid()
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
        else:
            # httptools buffers a header line until it ends, so one huge header is seen here,
            # chunk by chunk, before any callback can count it.
            if was_in_head and self._in_head:
                self._head_raw += len(data)
                if self._head_raw > self.limits.max_bytes:
                    self._refuse(431)

    def _invalid(self) -> None:
        message = "Invalid HTTP request received."
        self.logger.warning(message)
        self.send_400_response(message)

    # -- parser callbacks ---------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._head_bytes = self._head_raw = self._head_count = 0
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(self.limits.timeout, self._head_timed_out)

    def on_url(self, url: bytes) -> None:
        self._count(len(url), 0)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + 4, 1)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._cancel_head_timer()
        super().on_headers_complete()

    def _count(self, size: int, headers: int) -> None:
        self._head_bytes += size
        self._head_count += headers
        if self._head_bytes > self.limits.max_bytes or self._head_count > self.limits.max_headers:
            raise _Refused(431)  # httptools re-raises it from feed_data

    # -- refusing -----------------------------------------------------------------------

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._in_head and not self.transport.is_closing():
            self._refuse(408)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _refuse(self, status: int) -> None:
        self._refused = True
        self._in_head = False
        self._cancel_head_timer()
        self._unset_keepalive_if_required()
        if self.transport.is_closing():
            return
        reason = _REASONS[status]
        self.transport.write(
            b"HTTP/1.1 %d %s\r\ncontent-type: text/plain; charset=utf-8\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n%s"
            % (status, reason, len(reason), reason)
        )
        # Closing with unread input would make the kernel send a reset, which can destroy the
        # answer before the client reads it: half-close, drain briefly, then close.
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.flow.resume_reading()
        self.loop.call_later(_LINGER_S, self.transport.close)
