"""A live process in a Modal sandbox: the SDK's ``ContainerProcess`` (``exec.aio`` with
``text=False``) with its streams pumped into asyncio readers. UNVERIFIED against the live
service, like :mod:`vfray.runtimes.modal`."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from typing import Any

from vfray.runtimes.base import Runtime
from vfray.runtimes.live import STOP_GRACE, LiveProcess
from vfray.runtimes.processes import LIVE_LINE_LIMIT

KILL_WAIT = 10.0
"""Seconds to wait for the sandbox to report a SIGKILLed process's exit."""


class _ModalInput:
    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._closed = False
        self._eof: asyncio.Future[None] | None = None

    def write(self, data: bytes) -> None:
        self._stream.write(data)

    async def drain(self) -> None:
        await self._stream.drain.aio()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._stream.write_eof()
            self._eof = asyncio.ensure_future(self._stream.drain.aio())


async def _pump(source: Any, sink: asyncio.StreamReader) -> None:
    try:
        async for chunk in source:
            sink.feed_data(chunk if isinstance(chunk, bytes) else str(chunk).encode())
    except Exception:  # a dead sandbox ends the stream
        pass
    finally:
        sink.feed_eof()


class ModalProcess(LiveProcess):
    """One sandbox ``exec``; ``stop`` runs ``kill`` on its recorded pid inside the sandbox."""

    def __init__(self, runtime: Runtime, process: Any, pid_file: str) -> None:
        self._runtime = runtime
        self._process = process
        self._pid_file = pid_file
        self.pid = None
        self.stdin = _ModalInput(process.stdin)
        self.stdout = asyncio.StreamReader(limit=LIVE_LINE_LIMIT)
        self.stderr = asyncio.StreamReader(limit=LIVE_LINE_LIMIT)
        self._pumps = [
            asyncio.ensure_future(_pump(process.stdout, self.stdout)),
            asyncio.ensure_future(_pump(process.stderr, self.stderr)),
        ]
        self._code: int | None = None
        self._exited: asyncio.Future[int] = asyncio.ensure_future(self._wait())
        self._stopping: asyncio.Future[int] | None = None

    @property
    def returncode(self) -> int | None:
        return self._code

    async def _wait(self) -> int:
        code = await self._process.wait.aio()
        self._code = code if code is not None else -signal.SIGKILL
        return self._code

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)

    async def stop(self, grace: float = STOP_GRACE) -> int:
        if self._stopping is None:
            self._stopping = asyncio.ensure_future(self._stop(grace))
        return await asyncio.shield(self._stopping)

    async def _kill(self, sig: str) -> None:
        # The program's process group, then the program itself (it may lead none).
        script = f'p=$(cat "{self._pid_file}") && {{ kill -{sig} -- -$p; kill -{sig} $p; }}'
        with contextlib.suppress(Exception):
            await self._runtime.run(["sh", "-c", script], timeout=30)

    async def _stop(self, grace: float) -> int:
        if not self._exited.done():
            await self._kill("TERM")
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._exited), grace)
        if not self._exited.done():
            await self._kill("KILL")
        try:
            return await asyncio.wait_for(asyncio.shield(self._exited), KILL_WAIT)
        except TimeoutError:  # the sandbox is going down with it anyway
            return -signal.SIGKILL
