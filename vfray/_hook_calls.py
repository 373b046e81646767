"""How scoring hooks are called: level by level, concurrently within a level, under one
deadline, and sync ones on a bounded pool of daemon threads of their own.

Why not ``asyncio.to_thread``: the loop's default pool (6 workers on 2 CPUs) is shared with file
writes, stray sweeps and ``rmtree``, so a few hooks that block starved every other rollout's
setup and teardown, and ``asyncio.run`` joins that pool on the way out, so a hook that never
returns kept the process alive forever. Here a hook past its deadline is abandoned (Python cannot
kill a thread): it keeps its thread until it returns, but nothing waits for it at exit, and the
pool starts another thread in its place, so ``HOOK_THREADS`` workers stay live however many
hooks hang (with a fixed pool, 8 tasks whose hooks never returned held all 16 threads, and 0 of
56 rollouts of a run came out ok, 40 of them with hooks that return at once).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import queue
import threading
from collections.abc import AsyncGenerator, Callable, Mapping
from concurrent.futures import Future
from typing import Any, Protocol, TypeVar

from vfray.errors import PhaseTimeoutError

T = TypeVar("T")


class Hook(Protocol):
    """What running a hook needs of it (:class:`vfray.scoring.ScoringHook` is one): this module
    sits below the scoring model and must not import it."""

    @property
    def name(self) -> str: ...
    @property
    def params(self) -> tuple[str, ...]: ...
    @property
    def func(self) -> Callable[..., Any] | None: ...
    @property
    def priority(self) -> int: ...


H = TypeVar("H", bound=Hook)

HOOK_THREADS = 16
"""Sync hooks running at once per process; more wait their turn (and their deadline)."""


class DaemonPool:
    """A minimal executor whose worker threads are daemons, started on demand, and never joined.

    ``max_workers`` bounds the *live* workers: a call given up with :meth:`abandon` while it
    runs no longer counts, so another worker may start in its place; the abandoned one goes on
    until its call returns, then stays only if the pool is short of live workers.
    """

    def __init__(self, max_workers: int, name: str) -> None:
        if max_workers < 1:
            raise ValueError("a DaemonPool needs at least one worker")
        self.max_workers = max_workers
        self.name = name
        self._work: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0
        self._started = 0
        self._abandoned: set[Future[Any]] = set()

    @property
    def abandoned(self) -> int:
        """Calls given up while running whose threads have not come back yet."""
        with self._lock:
            return len(self._abandoned)

    @property
    def threads(self) -> int:
        """Worker threads alive, abandoned ones included."""
        with self._lock:
            return self._threads

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        future: Future[T] = Future()
        with self._lock:
            self._work.put((future, fn))
            if self._idle == 0 and self._threads - len(self._abandoned) < self.max_workers:
                self._start_worker()
            else:
                self._idle = max(0, self._idle - 1)
        return future

    def abandon(self, future: Future[Any]) -> None:
        """Give ``future``'s call up: dropped if it has not started, else its thread stops
        counting against ``max_workers`` until the call returns, and a worker starts in its
        place when calls are waiting."""
        with self._lock:
            if future.cancel() or future.done():
                return
            self._abandoned.add(future)
            live = self._threads - len(self._abandoned)
            if self._work.qsize() > self._idle and live < self.max_workers:
                self._start_worker()

    def _start_worker(self) -> None:
        self._threads += 1
        self._started += 1
        name = f"{self.name}-{self._started}"
        threading.Thread(target=self._worker, name=name, daemon=True).start()

    def _worker(self) -> None:
        while True:
            future, fn = self._work.get()
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except BaseException as exc:
                    future.set_exception(exc)
            with self._lock:
                if future in self._abandoned:
                    self._abandoned.discard(future)
                    if self._threads - len(self._abandoned) > self.max_workers:
                        # A worker took this one's place meanwhile: the pool has enough.
                        self._threads -= 1
                        return
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
    pool = hook_pool()
    future = pool.submit(call)
    try:
        return await asyncio.wrap_future(future)
    except asyncio.CancelledError:
        pool.abandon(future)
        raise


async def run_levels(
    hooks: list[H],
    owner: Any,
    available: Mapping[str, Any],
    offload: bool,
    timeout: float | None = None,
) -> AsyncGenerator[list[tuple[H, Any]], None]:
    """Run hooks level by level (highest priority first), concurrently within a level.

    With ``timeout`` (seconds, for all levels together), a hook still running when it expires
    is abandoned and its result is a :class:`PhaseTimeoutError`; later levels get the same.
    """
    deadline = None if timeout is None else asyncio.get_running_loop().time() + timeout
    priorities = sorted({h.priority for h in hooks}, reverse=True)
    for level in ([h for h in hooks if h.priority == p] for p in priorities):
        results = await asyncio.gather(
            *(_invoke(h, owner, available, offload, deadline) for h in level)
        )
        yield list(zip(level, results, strict=True))


async def _invoke(
    hook: Hook,
    owner: Any,
    available: Mapping[str, Any],
    offload: bool,
    deadline: float | None,
) -> Any:
    """Run one hook; exceptions are returned, not raised, so siblings always finish."""
    fn = hook.func if hook.func is not None else getattr(owner, hook.name)
    kwargs = {p: available[p] for p in hook.params}

    async def call() -> Any:
        try:
            # A hook object (a vf.Judge) is async through its __call__.
            is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
                type(fn).__call__
            )
            if is_async or not offload:
                result = fn(**kwargs)
            else:
                # A blocking sync hook must not stall the event loop other rollouts share, nor
                # the loop's default thread pool that their file I/O shares.
                result = await run_in_hook_thread(fn, **kwargs)
            if inspect.isawaitable(result):
                result = await result
            return result
        except Exception as exc:
            return exc

    if deadline is None:
        return await call()
    left = max(0.0, deadline - asyncio.get_running_loop().time())
    try:
        return await asyncio.wait_for(call(), left)
    except TimeoutError:
        return PhaseTimeoutError(f"{hook.name} did not return before the scoring deadline")
