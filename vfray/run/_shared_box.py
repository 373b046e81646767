"""A box several seats of one game work in (``Seat(box=...)``): started by the first seat's boot,
stopped by the last seat's teardown or the game's end; each seat holds it through a lease."""

from __future__ import annotations

import asyncio
from typing import Any

from vfray.runtimes.base import Runtime


class SharedBox:
    """A box several seats work in: started by the first seat's boot, stopped by the last
    seat's teardown (or by the game's end, whatever happened)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.users = 0
        self._started: asyncio.Future[None] | None = None
        self._stopped = False

    async def start(self) -> None:
        self.users += 1
        if self._started is None:
            self._started = asyncio.ensure_future(self.runtime.start())
        await asyncio.shield(self._started)

    async def release(self) -> None:
        self.users -= 1
        if self.users <= 0:
            await self.close()

    async def close(self) -> None:
        if not self._stopped:
            self._stopped = True
            await self.runtime.stop()


class Lease:
    """One seat's handle on a shared box: everything but start and stop goes to the box."""

    def __init__(self, box: SharedBox) -> None:
        self._box = box
        self._held = False

    async def start(self) -> None:
        self._held = True
        await self._box.start()

    async def stop(self) -> None:
        if self._held:
            self._held = False
            await self._box.release()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._box.runtime, name)
