"""One sync facade over the async core: run a coroutine to completion from plain code, also
from inside a running event loop (a Jupyter cell), where ``asyncio.run`` would refuse. The loop
is uvloop's where it is installed (``ray[serve]`` brings it, through ``uvicorn[standard]``), as
Ray's async actors run theirs, unless ``asyncio`` is asked for.

Every coroutine running under :func:`run_sync` can be cancelled from outside its loop with
:func:`cancel_runs` (a signal handler stopping the run; it must not depend on SIGINT, which a
job started in the background has ignored)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TypeVar

T = TypeVar("T")

EventLoop = Literal["uvloop", "asyncio"]
"""Which event loop :func:`run_sync` runs on."""

# No lock: a signal handler reading it may interrupt the very thread that changes it (set
# operations are atomic under the GIL).
_RUNNING: set[asyncio.Task[Any]] = set()


async def _tracked(coro: Coroutine[Any, Any, T]) -> T:
    task = asyncio.current_task()
    assert task is not None
    _RUNNING.add(task)
    try:
        return await coro
    finally:
        _RUNNING.discard(task)


def cancel_runs() -> bool:
    """Cancel every coroutine :func:`run_sync` is running (safe from a signal handler and from
    any thread): each unwinds through its own clean-up and its ``run_sync`` raises
    :class:`asyncio.CancelledError`. False when none was running."""
    running = tuple(_RUNNING)
    for task in running:
        task.get_loop().call_soon_threadsafe(task.cancel)
    return bool(running)


def loop_factory(loop: EventLoop) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The factory of ``loop`` (None: asyncio's own). uvloop's scheduling, selector and
    transports are native: an agent's rollout cost vfray 11-14% less CPU on it
    (docs/guides/performance.md); without it installed, asyncio's loop is used."""
    if loop == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def _run(coro: Coroutine[Any, Any, T], loop: EventLoop) -> T:
    with asyncio.Runner(loop_factory=loop_factory(loop)) as runner:
        return runner.run(_tracked(coro))


def run_sync(coro: Coroutine[Any, Any, T], loop: EventLoop) -> T:
    """Run a coroutine to completion from sync code, also inside a running loop (Jupyter),
    on a new event loop of kind ``loop`` (the run's ``farm.event_loop``)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return _run(coro, loop)
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = _run(coro, loop)
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=target, name="vfray-farm")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    result: T = box["value"]
    return result
