"""The runtimes' own threads for blocking work: a small pool for short calls (file I/O, rmtree of
work dirs, /proc sweeps, docker API calls) and a thread per call for calls that wait on a program
(a docker exec), so neither shares asyncio's default executor with user hooks.

Why: on 2 CPUs the default executor has 6 workers; six blocking sync scoring hooks filled it and
every box's start/stop in the process waited behind them until their phase deadlines passed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from vfray.runtimes.launches import cpu_count

T = TypeVar("T")

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_pool_pid = -1


def pool_size() -> int:
    """Workers of the short-call pool: 2 per CPU, within 4..8 (the calls are short; more
    threads would only contend for the GIL with the event loop)."""
    return min(8, max(4, 2 * cpu_count()))


def runtime_executor() -> ThreadPoolExecutor:
    """The process's pool for short blocking runtime work, created on first use (and again in
    a forked child, whose copy has no threads)."""
    global _pool, _pool_pid
    with _lock:
        if _pool is None or _pool_pid != os.getpid():
            _pool = ThreadPoolExecutor(pool_size(), thread_name_prefix="vfray-runtime")
            _pool_pid = os.getpid()
        return _pool


async def blocking(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a short blocking call in the runtimes' pool."""
    call = functools.partial(fn, *args, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(runtime_executor(), call)


async def waiting(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a call that blocks for as long as a program runs in a thread of its own, so that N
    programs running at once never hold the pool that starts and stops boxes."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]

    def work() -> None:
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:  # handed to the awaiting task
            error: BaseException | None = exc
            result = None
        else:
            error = None
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody awaits this any more
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=work, name="vfray-runtime-wait", daemon=True).start()
    return await future
