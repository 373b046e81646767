"""``GroupStream``: the async iterator :meth:`vfray.Farm.stream` returns. A producer task owns
the run (backend, driver, sandboxes) and hands each scored group over a one-slot queue, so a
trainer that stops early (``break``, then leaving ``with vf.Farm(...)``) cancels one task whose
clean-up tears every box down, instead of leaving nested async generators for the event loop
to finalise out of order."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from vfray.run.outcomes import EpisodeGroup

Deliver = Callable[[EpisodeGroup], Awaitable[None]]


class GroupStream:
    """Yields each task's scored group as soon as it finishes. ``aclose()`` (or the Farm's
    ``close()``) cancels the run; the rows already written stay in the run folder."""

    def __init__(self, produce: Callable[[Deliver], Awaitable[None]]) -> None:
        self._produce = produce
        # One slot: a trainer busy with a step holds the farm back, so groups stay fresh.
        self._queue: asyncio.Queue[EpisodeGroup] | None = None
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._cancelled = False

    def __aiter__(self) -> GroupStream:
        return self

    def _started(self) -> tuple[asyncio.Task[None], asyncio.Queue[EpisodeGroup]]:
        if self._task is None or self._queue is None:
            if self._cancelled:
                raise RuntimeError("this stream was closed")
            queue: asyncio.Queue[EpisodeGroup] = asyncio.Queue(maxsize=1)
            self._queue = queue
            self._loop = asyncio.get_running_loop()
            self._task = asyncio.ensure_future(self._produce(queue.put))
        return self._task, self._queue

    async def __anext__(self) -> EpisodeGroup:
        if self._cancelled and self._task is None:
            raise StopAsyncIteration
        task, queue = self._started()
        if queue.empty() and not task.done():
            getter = asyncio.ensure_future(queue.get())
            try:
                await asyncio.wait([getter, task], return_when=asyncio.FIRST_COMPLETED)
            finally:
                if not getter.done():
                    getter.cancel()
            if getter.done() and not getter.cancelled():
                return getter.result()
        if not queue.empty():
            return queue.get_nowait()
        if not task.cancelled():
            task.result()  # the run's own error, if it failed
        raise StopAsyncIteration

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def cancel(self, on_done: Callable[[], object] | None = None) -> None:
        """Cancel the run from any thread without waiting. ``on_done`` runs (on the stream's
        loop) once the run's clean-up has finished, or at once when nothing runs."""
        self._cancelled = True
        task, loop = self._task, self._loop
        if task is None or loop is None or task.done():
            if on_done is not None:
                on_done()
            return

        def cancel_on_loop() -> None:
            if on_done is not None:
                task.add_done_callback(lambda _t: on_done())
            task.cancel()

        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            cancel_on_loop()
        elif loop.is_closed():
            if on_done is not None:
                on_done()
        else:
            loop.call_soon_threadsafe(cancel_on_loop)

    def cancel_and_wait(self, timeout: float = 120.0) -> None:
        """From a thread other than the stream's loop: cancel and wait for the clean-up."""
        finished = threading.Event()
        self.cancel(finished.set)
        finished.wait(timeout)

    async def aclose(self) -> None:
        """Cancel the run and wait until every box is torn down and the rows are written."""
        self._cancelled = True
        task = self._task
        if task is None or task.done():
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def __aenter__(self) -> GroupStream:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()
