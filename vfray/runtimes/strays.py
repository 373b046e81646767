"""Finding and killing a box's stray processes (ones that left its process group with setsid)
by the marker in their environment, with the sweeps of boxes that stop together batched into
one walk of /proc."""

from __future__ import annotations

import asyncio
import time
import weakref

from vfray.runtimes._executor import blocking
from vfray.runtimes._reap import env_pids
from vfray.runtimes.processes import MARKER_ENV, kill_pids


def pids_by_env(name: str) -> dict[str, list[int]]:
    """Value of the environment variable ``name`` -> PIDs of the live processes carrying it
    (one walk of /proc; this process left out): for the Ray layer's own markers, such as a
    local Ray start's token."""
    return env_pids(name)


def marked_pids(marker: str) -> list[int]:
    """PIDs of live processes whose environment carries ``VFRAY_BOX_ID=marker`` (Linux /proc)."""
    return marked_pids_of({marker}).get(marker, [])


def marked_pids_of(markers: set[str]) -> dict[str, list[int]]:
    """One walk of /proc for many boxes: box id → PIDs carrying its marker."""
    found = env_pids(MARKER_ENV)
    return {marker: found[marker] for marker in markers if marker in found}


def _sweep_boxes(markers: set[str]) -> None:
    """Kill every process carrying one of ``markers``; twice, as a stray may be mid-fork."""
    for attempt in range(2):
        for pids in marked_pids_of(markers).values():
            kill_pids(pids)
        if attempt == 0:
            time.sleep(0.01)


class _StraySweeper:
    """Batches the stray sweeps of every box stopping at about the same time into one /proc
    walk (in a thread): a farm host stops dozens of boxes a second, and a walk per box cost
    more CPU than the rollouts' own work here."""

    def __init__(self) -> None:
        self._pending: dict[str, list[asyncio.Future[None]]] = {}
        self._worker: asyncio.Task[None] | None = None

    async def sweep(self, marker: str) -> None:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self._pending.setdefault(marker, []).append(done)
        if self._worker is None or self._worker.done():
            self._worker = loop.create_task(self._drain())
        await asyncio.shield(done)

    async def _drain(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, {}
            try:
                await blocking(_sweep_boxes, set(batch))
            finally:
                for futures in batch.values():
                    for future in futures:
                        if not future.done():
                            future.set_result(None)


_sweepers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _StraySweeper] = (
    weakref.WeakKeyDictionary()
)


def stray_sweeper() -> _StraySweeper:
    """The sweeper of the running event loop."""
    loop = asyncio.get_running_loop()
    sweeper = _sweepers.get(loop)
    if sweeper is None:
        sweeper = _sweepers[loop] = _StraySweeper()
    return sweeper
