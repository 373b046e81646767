"""A live process in a docker container: an exec with stdin attached, over the engine's hijacked
socket (stdout and stderr come multiplexed in 8-byte-header frames), stopped through its host
processes, found on the host by a marker in their environment (the engine must be local, as for
the docker runtime's timeouts; the engine's own ``Pid`` for an exec can lag behind, naming runc's
short-lived setup process or none)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import struct
import uuid
from typing import Any

from vfray.runtimes._executor import blocking
from vfray.runtimes._reap import env_pids
from vfray.runtimes.live import STOP_GRACE, LiveProcess
from vfray.runtimes.processes import LIVE_LINE_LIMIT

_HEADER = struct.Struct(">BxxxL")
EXEC_ENV = "VFRAY_EXEC"
_KILL_TRIES = 30
"""Seconds to keep SIGKILLing a stopped exec's tree until the engine reports it gone."""


class _SocketInput:
    """The stdin end: writes are queued and sent in order; ``close`` half-closes the socket,
    which the engine passes on as EOF on the program's stdin."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._pending = bytearray()
        self._flusher: asyncio.Future[None] | None = None
        self._closing = False

    def write(self, data: bytes) -> None:
        if self._closing:
            raise BrokenPipeError("stdin is closed")
        self._pending += data
        self._kick()

    def _kick(self) -> None:
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.ensure_future(self._flush())

    async def _flush(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending:
            chunk = bytes(self._pending)
            self._pending.clear()
            await loop.sock_sendall(self._sock, chunk)
        if self._closing:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_WR)

    async def drain(self) -> None:
        if self._flusher is not None:
            await asyncio.shield(self._flusher)

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        self._kick()


class DockerExecProcess(LiveProcess):
    """One ``exec`` in a container, its streams bridged to asyncio."""

    def __init__(self, api: Any, exec_id: str, raw: Any, token: str) -> None:
        self._api = api
        self._token = token
        self._exec_id = exec_id
        # docker-py hands back a SocketIO over a unix socket, or the TCP socket itself.
        self._sock: socket.socket = getattr(raw, "_sock", raw)
        self._sock.setblocking(False)
        self._keep = raw
        self.pid = None
        self.stdin = _SocketInput(self._sock)
        self.stdout = asyncio.StreamReader(limit=LIVE_LINE_LIMIT)
        self.stderr = asyncio.StreamReader(limit=LIVE_LINE_LIMIT)
        self._code: int | None = None
        self._reader = asyncio.ensure_future(self._demux())
        self._exited: asyncio.Future[int] = asyncio.ensure_future(self._wait())
        self._stopping: asyncio.Future[int] | None = None

    @property
    def returncode(self) -> int | None:
        return self._code

    async def _read_exactly(self, n: int) -> bytes:
        loop = asyncio.get_running_loop()
        data = bytearray()
        while len(data) < n:
            chunk = await loop.sock_recv(self._sock, n - len(data))
            if not chunk:
                raise EOFError
            data += chunk
        return bytes(data)

    async def _demux(self) -> None:
        try:
            while True:
                kind, size = _HEADER.unpack(await self._read_exactly(_HEADER.size))
                payload = await self._read_exactly(size) if size else b""
                (self.stderr if kind == 2 else self.stdout).feed_data(payload)
        except (EOFError, OSError):
            pass
        finally:
            self.stdout.feed_eof()
            self.stderr.feed_eof()

    async def _wait(self) -> int:
        await asyncio.shield(self._reader)
        # The streams may close before the exec is reaped: poll the engine until it is.
        delay = 0.01
        while True:
            info = await blocking(self._api.exec_inspect, self._exec_id)
            if not info.get("Running"):
                code = info.get("ExitCode")
                self._code = code if code is not None else -signal.SIGKILL
                with contextlib.suppress(OSError):
                    self._sock.close()
                return self._code
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.2)

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)

    async def stop(self, grace: float = STOP_GRACE) -> int:
        if self._stopping is None:
            self._stopping = asyncio.ensure_future(self._stop(grace))
        return await asyncio.shield(self._stopping)

    async def _signal(self, sig: int) -> bool:
        return await blocking(signal_exec, self._token, sig)

    async def _stop(self, grace: float) -> int:
        if not self._exited.done() and await self._signal(signal.SIGTERM):
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._exited), grace)
        for _ in range(_KILL_TRIES):
            if self._exited.done() or not await self._signal(signal.SIGKILL):
                break
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._exited), 1.0)
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        return await self._exited


def signal_exec(token: str, sig: int) -> bool:
    """Send ``sig`` to the processes of the exec marked ``token``; whether there were any."""
    pids = exec_pids(token)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
    return bool(pids)


def exec_pids(token: str) -> list[int]:
    """Host pids of the processes carrying ``VFRAY_EXEC=token`` in their environment."""
    return env_pids(EXEC_ENV).get(token, [])


async def open_exec(
    api: Any,
    container_id: str,
    argv: list[str],
    environment: dict[str, str],
    workdir: str,
    user: str = "",
) -> DockerExecProcess:
    """Create and start an attached exec, marked for :func:`exec_pids`, as ``user``
    (resolved by the container's /etc/passwd; "": the container's user)."""
    token = uuid.uuid4().hex
    exec_id = (
        await blocking(
            api.exec_create,
            container_id,
            argv,
            stdin=True,
            stdout=True,
            stderr=True,
            environment={**environment, EXEC_ENV: token},
            workdir=workdir,
            user=user,
        )
    )["Id"]
    raw = await blocking(api.exec_start, exec_id, socket=True)
    return DockerExecProcess(api, exec_id, raw, token)
