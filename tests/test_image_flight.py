"""The image store's once-per-node machinery (vfray.runtimes._image_flight), with real flocks
and threads: the build slots cap how many run at once, one flight per key serves every waiter
(a cancelled waiter does not cancel it), only failures of the image's content are kept, and
scratch dirs of dead processes are swept."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from vfray.errors import SandboxError
from vfray.runtimes._image_flight import (
    ContentFailure,
    SingleFlight,
    build_slot,
    file_lock,
    scratch_dir,
)


def test_build_slots_cap_how_many_hold_at_once(tmp_path: Path) -> None:
    (tmp_path / "locks").mkdir()
    inside: list[int] = []
    peak = [0]
    lock = threading.Lock()
    release = threading.Event()

    def hold() -> None:
        with build_slot(tmp_path, 2):
            with lock:
                inside.append(1)
                peak[0] = max(peak[0], len(inside))
            release.wait(30)
            with lock:
                inside.pop()

    first = [threading.Thread(target=hold) for _ in range(2)]
    for thread in first:
        thread.start()
    while len(inside) < 2:
        time.sleep(0.01)
    third = threading.Thread(target=hold)
    third.start()
    time.sleep(0.5)  # room for the third to get in, were the cap broken
    assert len(inside) == 2
    release.set()
    for thread in [*first, third]:
        thread.join(30)
    assert peak[0] == 2 and inside == []


def test_a_file_lock_excludes_another_process(tmp_path: Path) -> None:
    lock = tmp_path / "key.lock"
    probe = (
        "import fcntl, os, sys\n"
        "fd = os.open(sys.argv[1], os.O_RDWR)\n"
        "try:\n    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\nexcept OSError:\n"
        "    print('held')\nelse:\n    print('free')\n"
    )
    with file_lock(lock):
        held = subprocess.run([sys.executable, "-c", probe, str(lock)], capture_output=True)
    free = subprocess.run([sys.executable, "-c", probe, str(lock)], capture_output=True)
    assert (held.stdout, free.stdout) == (b"held\n", b"free\n")


async def test_one_flight_serves_every_waiter_and_outlives_a_cancelled_one() -> None:
    flights = SingleFlight()
    calls = []
    gate = asyncio.Event()

    async def work() -> str:
        calls.append(1)
        await gate.wait()
        return "image"

    waiters = [asyncio.ensure_future(flights.do("k", work)) for _ in range(5)]
    await asyncio.sleep(0)
    waiters[0].cancel()
    await asyncio.sleep(0)
    gate.set()
    results = await asyncio.gather(*waiters[1:])
    assert results == ["image"] * 4 and calls == [1]
    assert waiters[0].cancelled()
    assert await flights.do("k", work) == "image" and calls == [1]  # kept


async def test_only_failures_of_the_content_are_kept() -> None:
    flights = SingleFlight()
    calls = []

    async def engine_down() -> str:
        calls.append(1)
        raise SandboxError("the engine failed")

    async def step_fails() -> str:
        calls.append(1)
        raise ContentFailure("returned a non-zero code: 3")

    for _ in range(2):
        with pytest.raises(SandboxError):
            await flights.do("pull", engine_down)
    assert len(calls) == 2  # tried again: the engine may answer next time
    for _ in range(2):
        with pytest.raises(ContentFailure):
            await flights.do("build", step_fails)
    assert len(calls) == 3  # the same content fails the same way: not built again


def test_scratch_dirs_of_dead_processes_are_swept(tmp_path: Path) -> None:
    (tmp_path / "tmp").mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()  # fmt: skip
    left = tmp_path / "tmp" / f"{dead}-1-0"
    (left / "half").mkdir(parents=True)
    mine = scratch_dir(tmp_path)
    assert not left.exists() and mine.is_dir() and mine.parent == tmp_path / "tmp"
    assert scratch_dir(tmp_path).exists() and mine.exists()  # a live process's stay
