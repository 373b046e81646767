"""Doing an image's work once per node: one asyncio task per key in a process (the others
await it), a ``flock`` per key across the node's processes, and a node-wide cap on how many
builds, loads and unpacks run at once (slot lock files).

Everything lives under :func:`image_cache_dir`, which must be on the node's own disk (a flock
on a shared filesystem may not exclude other nodes, which is fine: each node has its own store).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import shutil
import time
import weakref
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

from vfray.errors import SandboxError

T = TypeVar("T")

CACHE_ENV = "VFRAY_IMAGE_CACHE"
SLOT_POLL_S = 0.1


def image_cache_dir() -> Path:
    """The node's image store: ``$VFRAY_IMAGE_CACHE``, else ``~/.cache/vfray/images``."""
    found = os.environ.get(CACHE_ENV)
    root = Path(found) if found else Path.home() / ".cache" / "vfray" / "images"
    for sub in ("locks", "tmp"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    return root


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (blocking: call it from a thread)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def build_slot(cache: Path, slots: int) -> Iterator[None]:
    """Hold one of ``slots`` node-wide build slots (blocking: call it from a thread)."""
    fds = [
        os.open(cache / "locks" / f"build-slot-{i}", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        for i in range(max(1, slots))
    ]
    held = -1
    try:
        while held < 0:
            for fd in fds:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError as exc:
                    if exc.errno not in (errno.EAGAIN, errno.EACCES):
                        raise
                    continue
                held = fd
                break
            else:
                time.sleep(SLOT_POLL_S)
        yield
    finally:
        for fd in fds:
            os.close(fd)


def scratch_dir(cache: Path) -> Path:
    """A fresh work dir under ``<cache>/tmp`` (same filesystem as the store, so the finished
    result is renamed into place), named by this process's pid; those of dead processes are
    removed first (a node that died mid-unpack leaves no half-made image behind for long)."""
    tmp = cache / "tmp"
    for entry in tmp.iterdir():
        pid = entry.name.split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(entry, ignore_errors=True)
    for attempt in range(100):
        path = tmp / f"{os.getpid()}-{time.monotonic_ns()}-{attempt}"
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path
    raise OSError(f"cannot make a work dir under {tmp}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _landed(
    flights: dict[str, asyncio.Future[object]], key: str, done: asyncio.Future[object]
) -> None:
    flights.pop(key, None)
    if not done.cancelled():
        done.exception()  # retrieved: every waiter may have been cancelled


class ContentFailure(SandboxError):
    """An image that fails because of what it is made of (a build step that fails, an archive
    that does not load, no shell): the same content fails the same way, so the failure is kept
    for the process's later asks. Callers re-raise it as a plain :class:`SandboxError`."""


class SingleFlight:
    """One asyncio task per key and event loop; every caller of :meth:`do` for that key awaits
    it (a caller cancelled while waiting does not cancel the work others wait for). A result is
    kept for later calls, and so is a :class:`ContentFailure`; after any other failure (an
    engine or a registry that failed this time) the next call tries again."""

    def __init__(self) -> None:
        self._flights: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, dict[str, asyncio.Future[object]]
        ] = weakref.WeakKeyDictionary()
        self._done: dict[str, object] = {}
        self._failed: dict[str, BaseException] = {}

    def cached(self, key: str) -> object | None:
        """A kept result for ``key`` (re-raises a kept failure), or None."""
        failed = self._failed.get(key)
        if failed is not None:
            raise failed
        return self._done.get(key)

    def forget(self, key: str) -> None:
        self._done.pop(key, None)
        self._failed.pop(key, None)

    def forget_result(self, key: str) -> None:
        """Drop a kept result for ``key`` (what it named is gone); a kept failure stays."""
        self._done.pop(key, None)

    async def do(self, key: str, work: Callable[[], Awaitable[T]]) -> T:
        kept = self.cached(key)
        if kept is not None:
            return kept  # type: ignore[return-value]
        flights = self._flights.setdefault(asyncio.get_running_loop(), {})
        flight = flights.get(key)
        if flight is None:
            flight = flights[key] = asyncio.ensure_future(self._run(key, work))
            flight.add_done_callback(lambda done: _landed(flights, key, done))
        result: T = await asyncio.shield(flight)  # type: ignore[arg-type]
        return result

    async def _run(self, key: str, work: Callable[[], Awaitable[T]]) -> T:
        try:
            result = await work()
        except ContentFailure as exc:
            self._failed[key] = exc
            raise
        self._done[key] = result
        return result
