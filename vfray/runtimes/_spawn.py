"""Starting a child process from any event loop with the cost of ``vfork`` and no hang when it is
cancelled: the ``asyncio.subprocess.Process`` surface the local runtimes use (pid, returncode,
stream pipes, ``wait``, ``kill``), built on ``subprocess.Popen`` and a pidfd, on the stdlib loop
and on uvloop alike.

Why not the stdlib's ``create_subprocess_exec``: a spawn cancelled while its pipes are being
connected never returns on Python 3.11 (CPython gh-125502, gh-133536): the transport's
``_connect_pipes`` task is cancelled too, so the call that wakes ``transport._wait()`` is never
made. ``asyncio.run`` cancels every task when its main coroutine returns, so a trainer leaving
``with vf.Farm(...)`` while a rollout's harness program was starting hung at exit (3 runs in 40
of ``tests/test_stream_stop.py``'s script under load; 4 spawns cancelled within 3 loop turns of
starting hang every time). Here nothing outlives the cancelled call: the pipes are connected by
the caller's own task, and on any error the child is killed and reaped before the error is
raised. The stdlib also starts a waiter thread per child; a pidfd in the loop needs none.

Why not uvloop's: a Ray async actor runs on uvloop, whose ``subprocess_exec`` is libuv's
``uv_spawn``, a full ``fork()`` of the actor (~150 MB RSS, ~25 threads) with every at-fork handler
run. Measured here from a SandboxHost: 6.1 ms of the actor's CPU per ``/bin/true`` spawn against
0.7 ms from the stdlib loop, whose ``Popen`` uses ``vfork``.

The pipes are made here, not by ``Popen``: uvloop's ``connect_read_pipe`` / ``connect_write_pipe``
hand the descriptor of the file object they are given to libuv, which closes it, and then close
the file object too (uvloop issues #763 and #764, open in 0.23). Given ``Popen``'s own file objects
that closed every pipe twice (``strace`` showed the second ``close`` of each returning EBADF); with
other threads opening files meanwhile (the host's thread pool, Ray's gRPC), the second close can
hit a descriptor that has just been handed to someone else: a harness program failed to start
with "[Errno 9] Bad file descriptor" (its launch pipe had been closed under it) in 1 of 1,024
rollouts. So each loop gets a bare descriptor (:class:`_PipeEnd`) that is closed once: by libuv on
uvloop, by the transport's ``close`` of the object on the stdlib loop.

Where pidfds do not work (not Linux >= 5.3, or a seccomp profile that refuses ``pidfd_open``),
the loop's own ``create_subprocess_exec`` is used.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
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
        transports: list[asyncio.BaseTransport],
    ) -> None:
        self._popen = popen
        self._transports = transports
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

    def close_pipes(self) -> None:
        """Close the pipes' transports (each closes its descriptor): done with the child.

        Not left to EOF and the garbage collector: a pipe a grandchild still holds sees no
        EOF, and in a Ray actor the collector runs off the loop's thread, where uvloop cannot
        close a handle; the descriptor then leaked (a read end per rollout, ~950 in a
        SandboxHost after 1,040 rollouts)."""
        for transport in self._transports:
            transport.close()

    async def wait(self) -> int:
        """The exit status, once the child exited (its pipes may stay open longer)."""
        return await asyncio.shield(self._exited)

    def send_signal(self, sig: int) -> None:
        if not self._exited.done():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def __del__(self) -> None:
        # A process dropped before its exit was seen: let subprocess reap it later.
        if self._pidfd >= 0:
            with contextlib.suppress(Exception):
                self._close_pidfd()


class _PipeEnd:
    """A pipe end handed to a loop's pipe transport, closed exactly once. uvloop's transport
    closes the descriptor itself (libuv's ``uv_close``) and then closes this object too, which
    must then do nothing; the stdlib's transport closes only this object, which closes the
    descriptor."""

    def __init__(self, fd: int, *, loop_closes_fd: bool) -> None:
        self.fd = fd
        self._closes_fd = not loop_closes_fd

    def fileno(self) -> int:
        return self.fd

    def close(self) -> None:
        if self._closes_fd and self.fd >= 0:
            os.close(self.fd)
        self.fd = -1


def _loop_closes_fd(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether the loop's pipe transports close the descriptor themselves: uvloop's do."""
    return type(loop).__module__.split(".")[0] == "uvloop"


async def _reader(
    loop: asyncio.AbstractEventLoop, fd: int, limit: int
) -> tuple[asyncio.StreamReader, asyncio.BaseTransport]:
    reader = asyncio.StreamReader(limit=limit, loop=loop)
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader, loop=loop),
        _PipeEnd(fd, loop_closes_fd=_loop_closes_fd(loop)),
    )
    return reader, transport


async def _writer(loop: asyncio.AbstractEventLoop, fd: int) -> asyncio.StreamWriter:
    # StreamReaderProtocol gives the write side the flow control StreamWriter.drain needs.
    protocol = asyncio.StreamReaderProtocol(asyncio.StreamReader(loop=loop), loop=loop)
    transport, _ = await loop.connect_write_pipe(
        lambda: protocol, _PipeEnd(fd, loop_closes_fd=_loop_closes_fd(loop))
    )
    return asyncio.StreamWriter(transport, protocol, None, loop)


class _Pipes:
    """The child's standard streams that are ``PIPE``: each a pipe made here, its child end
    given to ``Popen`` (closed here once the child has it), its parent end to the loop."""

    def __init__(self, stdin: int | None, stdout: int | None, stderr: int | None) -> None:
        self.popen_args: dict[str, int | None] = {
            "stdin": stdin,
            "stdout": stdout,
            "stderr": stderr,
        }
        """What ``Popen`` gets for each stream: a pipe's child end, or what was asked for."""
        self.parent: dict[str, int] = {}
        self._child_ends: list[int] = []
        try:
            for name, how in list(self.popen_args.items()):
                if how == PIPE:
                    read_end, write_end = os.pipe()  # both close-on-exec
                    if name == "stdin":
                        child, parent = read_end, write_end
                    else:
                        child, parent = write_end, read_end
                    self._child_ends.append(child)
                    self.parent[name] = parent
                    self.popen_args[name] = child
        except BaseException:
            self.close_child_ends()
            self.close_parent_ends()
            raise

    def close_child_ends(self) -> None:
        for fd in self._child_ends:
            os.close(fd)
        self._child_ends.clear()

    def close_parent_ends(self) -> None:
        """Those not handed to the loop yet (each is popped when it is)."""
        for fd in self.parent.values():
            os.close(fd)
        self.parent.clear()

    def take(self, name: str) -> int | None:
        """The parent end of ``name``, now owned by the caller (None: not a pipe)."""
        return self.parent.pop(name, None)


@functools.cache
def _pidfds_work() -> bool:
    """Whether this kernel (and seccomp profile) lets us open pidfds; asked once."""
    if not hasattr(os, "pidfd_open"):
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:
        return False
    return True


def uses_loop_subprocess() -> bool:
    """Whether children are started by the loop's own ``create_subprocess_exec``: only where
    pidfds do not work (see the module's docstring for why not elsewhere)."""
    return not _pidfds_work()


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
    """``asyncio.create_subprocess_exec`` with the same arguments, returning a
    :class:`PopenProcess` (where pidfds work). Raises what ``Popen`` raises; cancelled or
    failed after the start, the child is killed and reaped first."""
    loop = asyncio.get_running_loop()
    if uses_loop_subprocess():
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
    pipes = _Pipes(stdin, stdout, stderr)
    try:
        popen = subprocess.Popen(
            list(argv),
            stdin=pipes.popen_args["stdin"],
            stdout=pipes.popen_args["stdout"],
            stderr=pipes.popen_args["stderr"],
            cwd=cwd,
            env=dict(env),
            start_new_session=start_new_session,
            preexec_fn=preexec_fn,
            pass_fds=tuple(pass_fds),
            bufsize=0,
        )
    except BaseException:
        pipes.close_parent_ends()
        raise
    finally:
        pipes.close_child_ends()
    pidfd = -1
    w: asyncio.StreamWriter | None = None
    out: asyncio.StreamReader | None = None
    err: asyncio.StreamReader | None = None
    transports: list[asyncio.BaseTransport] = []
    try:
        pidfd = os.pidfd_open(popen.pid)
        if (fd := pipes.take("stdin")) is not None:
            w = await _writer(loop, fd)
            transports.append(w.transport)
        if (fd := pipes.take("stdout")) is not None:
            out, transport = await _reader(loop, fd, limit)
            transports.append(transport)
        if (fd := pipes.take("stderr")) is not None:
            err, transport = await _reader(loop, fd, limit)
            transports.append(transport)
    except BaseException:
        pipes.close_parent_ends()
        for transport in transports:
            transport.close()
        if pidfd >= 0:
            os.close(pidfd)
        # The caller never sees this child: kill what it may have started too (its group,
        # when it leads one), then reap it, so nothing it began outlives the error.
        with contextlib.suppress(OSError):
            if start_new_session:
                os.killpg(popen.pid, signal.SIGKILL)
        popen.kill()
        popen.wait()
        raise
    return PopenProcess(popen, pidfd, w, out, err, transports)
