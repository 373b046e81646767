"""The launch throttle: at most N harness programs *starting* at once per event loop, so a burst of
rollouts starts its programs in a steady stream, not all at once (which keeps every interpreter
alive and contending for the cores at the same time), while ``max_concurrent`` sessions stay open.

N is the runtime option ``launch_concurrency``, else ``$VFRAY_LAUNCH_CONCURRENCY``, else
:data:`CPU_FACTOR` x this host's CPUs; 0 turns the throttle off. A program launched with
``signals_ready`` holds its slot until it writes to the fd named by ``$VFRAY_READY_FD`` (the chat
loop does so once its imports are done), exits, or :data:`READY_TIMEOUT` passes; any other
program holds it for the spawn only.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import weakref

from vfray.errors import ConfigError

LAUNCH_CONCURRENCY_ENV = "VFRAY_LAUNCH_CONCURRENCY"
READY_FD_ENV = "VFRAY_READY_FD"
CPU_FACTOR = 8
"""Slots per CPU by default. A slot covers a program's whole start-up, which under load lasts
several times its ~65 ms of CPU, so launches/s <= slots / start-up: on 2 busy cores 2 x CPUs cut
rollouts/s by 20-40% (at c=32 and c=256), while 8 x CPUs kept them within noise (-2%) and still
cut the peak RSS at c=256 from 5.6 to 0.9 GiB (benchmarks/rollouts.py)."""
READY_TIMEOUT = 2.0
"""Seconds a launch holds its slot at most. The slot never waits on anything outside the program
(no request, no other launch): a program that is slow or never signals only delays the next one.
"""


def cpu_count() -> int:
    """CPUs this process may run on (its affinity mask, which a pinned worker narrows)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def launch_limit(option: int | None = None) -> int:
    """The throttle's size: ``option``, else the environment variable, else 8 x CPUs."""
    source = "launch_concurrency"
    if option is None:
        raw = os.environ.get(LAUNCH_CONCURRENCY_ENV, "").strip()
        if not raw:
            return CPU_FACTOR * cpu_count()
        source = LAUNCH_CONCURRENCY_ENV
        try:
            option = int(raw)
        except ValueError:
            raise ConfigError(f"{source}={raw!r} is not an integer") from None
    if option < 0:
        raise ConfigError(f"{source} must be >= 0 (0: no throttle), got {option}")
    return option


_slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, asyncio.Semaphore]] = (
    weakref.WeakKeyDictionary()
)


def launch_slots(limit: int) -> asyncio.Semaphore | None:
    """The running loop's semaphore of ``limit`` slots (shared by every runtime asking for the
    same size), or None for 0 (no throttle)."""
    if limit <= 0:
        return None
    per_size = _slots.setdefault(asyncio.get_running_loop(), {})
    slots = per_size.get(limit)
    if slots is None:
        slots = per_size[limit] = asyncio.Semaphore(limit)
    return slots


class Launch:
    """One program launch through the throttle: ``await acquire()`` before the spawn, then
    :meth:`spawned` right after it; :meth:`release` (idempotent) in a ``finally``."""

    def __init__(self, slots: asyncio.Semaphore | None, signals_ready: bool) -> None:
        self.slots = slots
        self.signals_ready = signals_ready and slots is not None
        self._held = False
        self._read_fd = -1
        self.write_fd = -1
        """The end the program writes to; passed to it, closed here once it is spawned."""
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def acquire(self) -> None:
        if self.slots is not None:
            await self.slots.acquire()
            self._held = True
        if self.signals_ready:
            self._read_fd, self.write_fd = os.pipe()

    def child_env(self, env: dict[str, str]) -> dict[str, str]:
        if self.write_fd >= 0:
            env[READY_FD_ENV] = str(self.write_fd)
        return env

    def spawned(self) -> None:
        """The program is spawned: wait for its signal, its exit (EOF) or the timeout."""
        self._close_write()
        if self._read_fd < 0:
            self.release()
            return
        self._loop = loop = asyncio.get_running_loop()
        loop.add_reader(self._read_fd, self.release)
        self._timer = loop.call_later(READY_TIMEOUT, self.release)

    def _close_write(self) -> None:
        if self.write_fd >= 0:
            os.close(self.write_fd)
            self.write_fd = -1

    def release(self) -> None:
        self._close_write()
        if self._read_fd >= 0:
            if self._loop is not None:
                with contextlib.suppress(RuntimeError):  # the loop is already closed
                    self._loop.remove_reader(self._read_fd)
            os.close(self._read_fd)
            self._read_fd = -1
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._held and self.slots is not None:
            self._held = False
            self.slots.release()
