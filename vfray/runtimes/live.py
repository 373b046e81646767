"""Live processes in a box: a program with streaming stdin/stdout/stderr (an ACP agent, a tool
server) that the caller talks to while it runs, and stops with SIGTERM then SIGKILL.

:class:`LiveProcess` is the contract every runtime's ``open_process`` returns;
:class:`LocalProcess` is the host-process implementation (subprocess, bwrap), and
:class:`BackgroundProcess` keeps a helper's output drained so it never blocks on a full pipe.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import functools
import os
import signal
from pathlib import Path
from typing import Protocol

from vfray.runtimes._executor import blocking
from vfray.runtimes._spawn import PopenProcess

STOP_GRACE = 5.0
"""Default seconds between SIGTERM and SIGKILL in :meth:`LiveProcess.stop`."""

BACKGROUND_TAIL = 64 * 1024
"""Bytes of a background helper's stdout and of its stderr kept (the tail)."""


class ProcessInput(Protocol):
    """The writing end of a live process's stdin (``asyncio.StreamWriter`` is one)."""

    def write(self, data: bytes) -> None: ...

    async def drain(self) -> None: ...

    def close(self) -> None: ...


class LiveProcess(abc.ABC):
    """A program running in a box, with its standard streams open to the caller.

    ``stdout``/``stderr`` reach EOF when the program (and whatever inherited them) closes them;
    ``wait`` returns the exit status (negative signal number when a signal ended it, where the
    runtime can tell). ``stop`` sends SIGTERM to the program's whole process tree, SIGKILL after
    ``grace`` seconds, and returns the status; it is idempotent and safe after the program
    exited."""

    pid: int | None
    """The host pid of the program's root process, where there is one."""
    stdin: ProcessInput
    stdout: asyncio.StreamReader
    stderr: asyncio.StreamReader

    @property
    @abc.abstractmethod
    def returncode(self) -> int | None:
        """The exit status once known, else None."""

    @abc.abstractmethod
    async def wait(self) -> int:
        """Wait for the program to exit; its exit status."""

    @abc.abstractmethod
    async def stop(self, grace: float = STOP_GRACE) -> int:
        """SIGTERM the process tree, SIGKILL it after ``grace`` seconds; the exit status."""


def _read_proc(path: str) -> bytes | None:
    """A small /proc file's bytes (None: gone), read from a descriptor up to its end:
    ``open()``'s buffered file object cost ~12 µs a file against ~7 µs here, and stopping a box
    reads one per thread of each of its processes (~30 for an ACP agent's tree). A /proc read
    may stop short of the end (at a record that does not fit), so it reads until one is empty."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        parts = []
        while part := os.read(fd, 1 << 16):
            parts.append(part)
        return b"".join(parts)
    except OSError:
        return None
    finally:
        os.close(fd)


def _comm(pid: int) -> str:
    stat = _read_proc(f"/proc/{pid}/stat")
    if stat is None:
        return ""
    return stat[stat.find(b"(") + 1 : stat.rfind(b")")].decode(errors="replace")


def descendants(root: int) -> list[int]:
    """``root`` and every live process below it. Read down from ``root`` through each
    process's threads' ``/proc/PID/task/TID/children`` (the subtree's few files, not every
    process's: the whole-/proc walk cost ~2.4 ms of CPU per live process ended, 87 processes
    on the machine); where the kernel has no such file (``CONFIG_PROC_CHILDREN`` off), from
    the parent links of every process in /proc."""
    if not _children_files():
        return _descendants_by_walk(root)
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(_children(pid))
    return out


@functools.cache
def _children_files() -> bool:
    """Whether this kernel lists a thread's children in /proc (Linux 3.5+, a config option)."""
    return os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")


def _children(pid: int) -> list[int]:
    """``pid``'s children: a child is listed under the thread that forked it."""
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:  # gone
        return []
    found: list[int] = []
    for tid in threads:
        listing = _read_proc(f"/proc/{pid}/task/{tid}/children")
        if listing:  # None: the thread has exited
            found.extend(map(int, listing.split()))
    return found


def _descendants_by_walk(root: int) -> list[int]:
    """``root`` and every live process below it, from the parent links in /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The comm field may contain spaces and parentheses; the ppid follows the last ')'.
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


async def wait_exit(proc: asyncio.subprocess.Process) -> int:
    """Wait for the process itself to exit. ``proc.wait()`` alone also waits for its pipes to
    close (Python >= 3.11.x), which a daemon child holding stdout delays until it dies."""
    if isinstance(proc, PopenProcess):  # its wait() is the exit alone, seen by a pidfd
        return await proc.wait()
    waiter = asyncio.ensure_future(proc.wait())
    delay = 0.005
    try:
        while not waiter.done() and proc.returncode is None:
            await asyncio.wait([waiter], timeout=delay)
            delay = min(delay * 2, 0.1)
    finally:
        waiter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiter
    return proc.returncode if proc.returncode is not None else -signal.SIGKILL


def signal_tree(root: int, sig: int, spare: frozenset[str] = frozenset()) -> int:
    """Send ``sig`` to ``root``'s process group and to every live descendant of ``root`` (a
    descendant may have started its own session, as bwrap's boxed program does). Processes
    named in ``spare`` (their ``comm``: a namespace's wrapper that dies of SIGTERM instead of
    passing it on) are skipped, and so is the group, which they lead. Returns how many were
    signalled (the group counts as one): 0 for a box whose program is not exec'd yet."""
    signalled = 0
    if not spare:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(root, sig)
            signalled += 1
    for pid in descendants(root):
        if spare and _comm(pid) in spare:
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
            signalled += 1
    return signalled


async def stop_tree(
    pid: int,
    exited: asyncio.Future[int],
    grace: float,
    *,
    group: bool = True,
    spare: frozenset[str] = frozenset(),
) -> None:
    """SIGTERM ``pid``'s tree (but ``spare``), wait up to ``grace`` s for ``exited``, then
    SIGKILL the tree. Once the root has exited only its process group (``group``) is killed:
    its pid may belong to another program by then."""
    if not exited.done():
        await blocking(signal_tree, pid, signal.SIGTERM, spare)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(exited), grace)
    if not exited.done():
        await blocking(signal_tree, pid, signal.SIGKILL)
    elif group:
        # A child it left running in its group must not outlive it.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)


class LocalProcess(LiveProcess):
    """A live process that is a host process leading its own session (subprocess, bwrap)."""

    def __init__(
        self, proc: asyncio.subprocess.Process, spare: frozenset[str] = frozenset()
    ) -> None:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        self._proc = proc
        self.pid = proc.pid
        self.stdin = proc.stdin
        self.stdout = proc.stdout
        self.stderr = proc.stderr
        self._exited: asyncio.Future[int] | None = None
        self._stopping: asyncio.Future[int] | None = None
        self._spare = spare

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode

    def _exit_future(self) -> asyncio.Future[int]:
        if self._exited is None:
            self._exited = asyncio.ensure_future(wait_exit(self._proc))
        return self._exited

    async def wait(self) -> int:
        return await asyncio.shield(self._exit_future())

    async def stop(self, grace: float = STOP_GRACE) -> int:
        if self._stopping is None:
            self._stopping = asyncio.ensure_future(self._stop(grace))
        return await asyncio.shield(self._stopping)

    async def _stop(self, grace: float) -> int:
        exited = self._exit_future()
        await stop_tree(self._proc.pid, exited, grace, spare=self._spare)
        self.stdin.close()
        code = await exited
        if isinstance(self._proc, PopenProcess):
            self._proc.close_pipes()  # what was read stays readable
        return code


class _Tail:
    def __init__(self) -> None:
        self.data = bytearray()

    def add(self, chunk: bytes) -> None:
        self.data += chunk
        if len(self.data) > BACKGROUND_TAIL:
            del self.data[: len(self.data) - BACKGROUND_TAIL]

    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")


async def _drain(stream: asyncio.StreamReader, tail: _Tail) -> None:
    with contextlib.suppress(Exception):
        while chunk := await stream.read(65536):
            tail.add(chunk)


class BackgroundProcess:
    """A long-lived helper (a tool server) started by ``Runtime.run_background``: stdin closed,
    output drained into tails (:attr:`stdout`, :attr:`stderr`), torn down with the box."""

    def __init__(self, process: LiveProcess) -> None:
        self.process = process
        self.pid = process.pid
        self._out, self._err = _Tail(), _Tail()
        process.stdin.close()
        self._readers = [
            asyncio.ensure_future(_drain(process.stdout, self._out)),
            asyncio.ensure_future(_drain(process.stderr, self._err)),
        ]

    @property
    def stdout(self) -> str:
        return self._out.text()

    @property
    def stderr(self) -> str:
        return self._err.text()

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    async def wait(self) -> int:
        return await self.process.wait()

    async def stop(self, grace: float = STOP_GRACE) -> int:
        code = await self.process.stop(grace)
        await asyncio.wait(self._readers, timeout=0.5)
        for reader in self._readers:
            reader.cancel()
        return code
