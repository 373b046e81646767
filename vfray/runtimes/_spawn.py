"""Starting a child process from any event loop with the cost of ``vfork``: the
``asyncio.subprocess.Process`` surface the local runtimes use (pid, returncode, stream pipes,
``wait``, ``kill``), built on ``subprocess.Popen`` and a pidfd.

Why: a Ray async actor runs on uvloop, whose ``subprocess_exec`` is libuv's ``uv_spawn``, a full
``fork()`` of the actor (~150 MB RSS, ~25 threads) with every at-fork handler run. Measured here
from a SandboxHost: 6.1 ms of the actor's CPU per ``/bin/true`` spawn against 0.7 ms from the
stdlib loop, whose ``Popen`` uses ``vfork``. The stdlib loop keeps its own implementation.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
from collections.abc import Callable, Mapping, Sequence
from typing import Any

PIPE = subprocess.PIPE
DEVNULL = subprocess.DEVNULL


class PopenProcess:
    """A started child: ``asyncio.subprocess.Process``'s attributes and methods that the
    runtimes call, with its exit seen through a pidfd in the loop (no watcher thread)."""

    def __init__(
        self,
        popen: subprocess.Popen[bytes],
        pidfd: int,
        stdin: asyncio.StreamWriter | None,
        stdout: asyncio.StreamReader | None,
        stderr: asyncio.StreamReader | None,
    ) -> None:
        self._popen = popen
        self.pid = popen.pid
        self.stdin = stdin
        self.stdout = stdout
        self.stderr = stderr
        self._loop = asyncio.get_running_loop()
        self._exited: asyncio.Future[int] = self._loop.create_future()
        self._pidfd = pidfd
        self._loop.add_reader(pidfd, self._reap)

    def _reap(self) -> None:
        """The pidfd is readable: the child has exited; collect its status."""
        self._close_pidfd()
        code = self._popen.wait()
        if not self._exited.done():
            self._exited.set_result(code)

    def _close_pidfd(self) -> None:
        if self._pidfd >= 0:
            with contextlib.suppress(RuntimeError, ValueError):  # a closed loop
                self._loop.remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = -1

    @property
    def returncode(self) -> int | None:
        return self._popen.returncode if self._exited.done() else None

    async def wait(self) -> int:
        """The exit status, once the child exited (its pipes may stay open longer)."""
        return await asyncio.shield(self._exited)

    def send_signal(self, sig: int) -> None:
        if not self._exited.done():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        import signal

        self.send_signal(signal.SIGKILL)

    def __del__(self) -> None:
        # A process dropped before its exit was seen: let subprocess reap it later.
        if self._pidfd >= 0:
            with contextlib.suppress(Exception):
                self._close_pidfd()


async def _reader(loop: asyncio.AbstractEventLoop, pipe: Any, limit: int) -> asyncio.StreamReader:
    reader = asyncio.StreamReader(limit=limit, loop=loop)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader, loop=loop), pipe)
    return reader


async def _writer(loop: asyncio.AbstractEventLoop, pipe: Any) -> asyncio.StreamWriter:
    # StreamReaderProtocol gives the write side the flow control StreamWriter.drain needs.
    protocol = asyncio.StreamReaderProtocol(asyncio.StreamReader(loop=loop), loop=loop)
    transport, _ = await loop.connect_write_pipe(lambda: protocol, pipe)
    return asyncio.StreamWriter(transport, protocol, None, loop)


def uses_stdlib_subprocess(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether ``loop``'s own ``subprocess_exec`` is the stdlib's (``Popen``, so ``vfork``)."""
    return isinstance(loop, asyncio.BaseEventLoop) or not hasattr(os, "pidfd_open")


async def create_subprocess_exec(
    *argv: str,
    stdin: int | None,
    stdout: int | None,
    stderr: int | None,
    cwd: str,
    env: Mapping[str, str],
    start_new_session: bool,
    preexec_fn: Callable[[], None] | None,
    pass_fds: Sequence[int] = (),
    limit: int = 2**16,
) -> Any:
    """``asyncio.create_subprocess_exec`` with the same arguments; on a loop that is not the
    stdlib's (uvloop), a :class:`PopenProcess` instead. Raises what ``Popen`` raises."""
    loop = asyncio.get_running_loop()
    if uses_stdlib_subprocess(loop):
        return await asyncio.create_subprocess_exec(
            *argv,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            cwd=cwd,
            env=dict(env),
            start_new_session=start_new_session,
            preexec_fn=preexec_fn,
            pass_fds=tuple(pass_fds),
            limit=limit,
        )
    popen = subprocess.Popen(
        list(argv),
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        cwd=cwd,
        env=dict(env),
        start_new_session=start_new_session,
        preexec_fn=preexec_fn,
        pass_fds=tuple(pass_fds),
        bufsize=0,
    )
    pidfd = -1
    try:
        pidfd = os.pidfd_open(popen.pid)
        w = await _writer(loop, popen.stdin) if popen.stdin is not None else None
        out = await _reader(loop, popen.stdout, limit) if popen.stdout is not None else None
        err = await _reader(loop, popen.stderr, limit) if popen.stderr is not None else None
    except BaseException:
        if pidfd >= 0:
            os.close(pidfd)
        popen.kill()
        popen.wait()
        raise
    return PopenProcess(popen, pidfd, w, out, err)
