"""The threads sync scoring hooks run on: a bounded pool of daemon threads of their own.

Why not ``asyncio.to_thread``: the loop's default pool (6 workers on 2 CPUs) is shared with file
writes, stray sweeps and ``rmtree``, so a few hooks that block starved every other rollout's
setup and teardown, and ``asyncio.run`` joins that pool on the way out, so a hook that never
returns kept the process alive forever. Here a hook past its deadline is abandoned (Python cannot
kill a thread): it keeps its thread until it returns, but nothing waits for it at exit.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")

HOOK_THREADS = 16
"""Sync hooks running at once per process; more wait their turn (and their deadline)."""


class DaemonPool:
    """A minimal executor whose worker threads are daemons, started on demand up to
    ``max_workers``, and never joined."""

    def __init__(self, max_workers: int, name: str) -> None:
        if max_workers < 1:
            raise ValueError("a DaemonPool needs at least one worker")
        self.max_workers = max_workers
        self.name = name
        self._work: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        future: Future[T] = Future()
        with self._lock:
            self._work.put((future, fn))
            if self._idle == 0 and self._threads < self.max_workers:
                self._threads += 1
                threading.Thread(
                    target=self._worker, name=f"{self.name}-{self._threads}", daemon=True
                ).start()
            else:
                self._idle = max(0, self._idle - 1)
        return future

    def _worker(self) -> None:
        while True:
            future, fn = self._work.get()
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except BaseException as exc:
                    future.set_exception(exc)
            with self._lock:
                self._idle += 1


_POOL: DaemonPool | None = None
_POOL_LOCK = threading.Lock()


def hook_pool() -> DaemonPool:
    """This process's pool for sync hooks (made on first use)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = DaemonPool(HOOK_THREADS, "vfray-hook")
        return _POOL


async def run_in_hook_thread(fn: Callable[..., T], /, **kwargs: Any) -> T:
    """``fn(**kwargs)`` on a hook thread, with the caller's context variables; cancelling the
    await abandons the call (its thread finishes it, and nobody waits for that)."""
    call = functools.partial(contextvars.copy_context().run, fn, **kwargs)
    return await asyncio.wrap_future(hook_pool().submit(call))
