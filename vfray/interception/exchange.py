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
        self._changed = asyncio.Event()

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
        # A fresh event per change: readers waiting on the old one all wake, none miss an update.
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def head(self) -> tuple[int, dict[str, str]]:
        await self._head.wait()
        return self.status, self.headers

    async def body(self) -> bytes:
        while not self.done:
            await self._changed.wait()
        return b"".join(self.chunks)

    async def iter_chunks(
        self, keepalive: float = 0.0, comment: bytes = b""
    ) -> AsyncIterator[bytes]:
        """Every chunk, from the first, as it arrives (those pushed meanwhile joined in one);
        with ``keepalive`` > 0, ``comment`` after each ``keepalive`` seconds without either."""
        sent = 0
        while True:
            if sent < len(self.chunks):
                batch = self.chunks[sent:]
                sent += len(batch)
                yield b"".join(batch)
            elif self.done:
                return
            elif keepalive > 0:
                # A timeout on the wait itself, not a task per chunk raced against a timer.
                try:
                    async with asyncio.timeout(keepalive):
                        await self._changed.wait()
                except TimeoutError:
                    yield comment
            else:
                await self._changed.wait()
