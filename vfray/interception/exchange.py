"""One real upstream exchange as a replayable response: status, headers and body chunks.

The exchange runs in its own task, so a client that disconnects mid-stream does not cancel the
upstream call or its recording, and a retry of the same request can join it or replay it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator


class Exchange:
    """A response being produced: readers see every chunk, from the first, as it arrives."""

    def __init__(self, body_digest: bytes, stream: bool, request: bytes = b"") -> None:
        self.body_digest = body_digest
        self.request = request
        """The request body as sent, kept to recognise a re-send with its keys reordered."""
        self.stream = stream
        self.status = 0
        self.headers: dict[str, str] = {}
        self.chunks: list[bytes] = []
        self.done = False
        self.finished_at: float | None = None
        """``time.monotonic()`` when the exchange finished (None while it is in flight)."""
        self._head = asyncio.Event()
        self._waiters: list[asyncio.Future[None]] = []
        """Readers waiting for the next change, each woken once by it."""

    @property
    def ok(self) -> bool:
        return 0 < self.status < 400

    def start(self, status: int, headers: dict[str, str]) -> None:
        if self._head.is_set():
            return
        self.status = status
        self.headers = headers
        self._head.set()

    def push(self, chunk: bytes) -> None:
        if chunk:
            self.chunks.append(chunk)
            self._wake()

    def finish(self) -> None:
        self.done = True
        self.finished_at = time.monotonic()
        self._wake()

    def _wake(self) -> None:
        # Every reader waiting now wakes, none misses an update: a reader that was not waiting
        # sees the new chunks before it waits again. One future per wait, where an
        # asyncio.Event per change cost a deque and its bookkeeping per streamed event.
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _next_change(self) -> asyncio.Future[None]:
        """A future that the next change (a chunk, the finish) resolves."""
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        return waiter

    async def head(self) -> tuple[int, dict[str, str]]:
        await self._head.wait()
        return self.status, self.headers

    async def body(self) -> bytes:
        while not self.done:
            await self._next_change()
        return b"".join(self.chunks)

    async def iter_chunks(
        self, keepalive: float = 0.0, comment: bytes = b""
    ) -> AsyncIterator[bytes]:
        """Every chunk, from the first, as it arrives (those pushed meanwhile joined in one);
        with ``keepalive`` > 0, ``comment`` after each ``keepalive`` seconds without either."""
        sent = 0
        if keepalive <= 0:
            while True:
                if sent < len(self.chunks):
                    batch = self.chunks[sent:]
                    sent += len(batch)
                    yield b"".join(batch)
                elif self.done:
                    return
                else:
                    await self._next_change()
        # One timer for the silence, not one per wait: a streamed reply waits once per event,
        # and a timeout armed and cancelled each time cost more than relaying the event. The
        # timer is pushed back only when it fires (to the last chunk plus ``keepalive``).
        loop = asyncio.get_running_loop()
        last = loop.time()
        waiter: asyncio.Future[None] | None = None
        silent = False  # the timer found ``keepalive`` seconds without a chunk (and stopped)
        timer: asyncio.TimerHandle | None = None

        def check() -> None:
            nonlocal timer, silent
            left = last + keepalive - loop.time()
            if left > 0:
                timer = loop.call_later(left, check)
                return
            silent = True
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

        timer = loop.call_later(keepalive, check)
        try:
            while True:
                if sent < len(self.chunks) or silent:
                    if sent < len(self.chunks):
                        batch = self.chunks[sent:]
                        sent += len(batch)
                        out = b"".join(batch)
                    else:
                        out = comment
                    last = loop.time()
                    if silent:
                        silent = False
                        timer = loop.call_later(keepalive, check)
                    yield out
                elif self.done:
                    return
                else:
                    waiter = self._next_change()
                    await waiter
        finally:
            if timer is not None:
                timer.cancel()
