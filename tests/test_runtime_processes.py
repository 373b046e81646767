"""The local runtimes' process lifecycle on real processes: the launch throttle (a slot held until
the program signals, never forever) and boxes dying with their owner process (SIGKILL)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vfray.errors import ConfigError
from vfray.runtimes.launches import (
    CPU_FACTOR,
    LAUNCH_CONCURRENCY_ENV,
    READY_TIMEOUT,
    launch_limit,
)
from vfray.runtimes.registry import make_runtime
from vfray.runtimes.strays import marked_pids
from vfray.runtimes.subprocess import SubprocessRuntime

LOCAL = [
    "subprocess",
    pytest.param(
        "bwrap", marks=pytest.mark.skipif(shutil.which("bwrap") is None, reason="no bwrap")
    ),
]

# Launched first, through a throttle of one slot: did B start before A signalled, and does B
# start while A still runs (A waits for it, then exits)?
FIRST = """
import json, os, sys, time
signals = sys.argv[1] == "signal"
time.sleep(0.3)
seen_before = os.path.exists("b-started")
if signals:
    fd = int(os.environ["VFRAY_READY_FD"])
    os.write(fd, b".")
    os.close(fd)
deadline = time.monotonic() + 30
while not os.path.exists("b-started") and time.monotonic() < deadline:
    time.sleep(0.01)
print(json.dumps({"before_ready": seen_before, "while_running": os.path.exists("b-started")}))
"""
SECOND = "open('b-started', 'w').close()"


async def _first_then_second(kind: str, first_signals: bool) -> dict[str, bool]:
    async with make_runtime(kind, launch_concurrency=1) as rt:
        mode = "signal" if first_signals else "silent"
        first, second = await asyncio.gather(
            rt.run_program([sys.executable, "-c", FIRST, mode], timeout=60, signals_ready=True),
            rt.run_program([sys.executable, "-c", SECOND], timeout=60, signals_ready=True),
        )
    assert first.ok and second.ok, (first, second)
    seen: dict[str, bool] = json.loads(first.stdout)
    return seen


@pytest.mark.parametrize("kind", LOCAL)
async def test_launch_slot_is_held_until_the_program_signals(kind: str) -> None:
    seen = await _first_then_second(kind, first_signals=True)
    assert seen == {"before_ready": False, "while_running": True}


async def test_launch_slot_of_a_silent_program_is_released_by_the_timeout() -> None:
    # No deadlock: a program that never signals (nor exits) holds its slot READY_TIMEOUT at most.
    started = time.monotonic()
    seen = await _first_then_second("subprocess", first_signals=False)
    assert seen["while_running"]
    assert time.monotonic() - started >= READY_TIMEOUT


async def test_plain_runs_and_unthrottled_programs_share_no_slot() -> None:
    async with make_runtime("subprocess", launch_concurrency=1) as rt:
        program = rt.run_program([sys.executable, "-c", FIRST, "silent"], timeout=60)
        # Not flagged with signals_ready: the slot is freed once it is spawned.
        other = rt.run_program([sys.executable, "-c", SECOND], timeout=60)
        first, second = await asyncio.gather(program, other)
    assert json.loads(first.stdout)["while_running"] and second.ok


def test_launch_limit_option_env_and_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(LAUNCH_CONCURRENCY_ENV, raising=False)
    assert launch_limit(None) == CPU_FACTOR * len(os.sched_getaffinity(0))
    monkeypatch.setenv(LAUNCH_CONCURRENCY_ENV, "3")
    assert launch_limit(None) == 3
    assert launch_limit(0) == 0  # the option wins; 0: no throttle
    assert SubprocessRuntime().launch_concurrency == 3
    monkeypatch.setenv(LAUNCH_CONCURRENCY_ENV, "many")
    with pytest.raises(ConfigError, match=LAUNCH_CONCURRENCY_ENV):
        launch_limit(None)
    with pytest.raises(ConfigError, match=">= 0"):
        make_runtime("subprocess", launch_concurrency=-1)


# The owner: starts a box whose program leaves a grandchild in its group and a stray in a
# session of its own, prints the box id once all three run, then waits to be killed.
OWNER = """
import asyncio, sys
from vfray.runtimes.registry import make_runtime

PROGRAM = "sleep 300 & setsid sleep 300 & touch started; wait"

async def main():
    rt = make_runtime(sys.argv[1])
    await rt.start()
    run = asyncio.ensure_future(rt.run(["sh", "-c", PROGRAM], timeout=600))
    while not rt.resolve("started").exists():
        await asyncio.sleep(0.01)
    print(rt.box_id, flush=True)
    await run

asyncio.run(main())
"""


def _dead(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"  # killed, not yet reaped by its new parent


@pytest.mark.parametrize("kind", LOCAL)
def test_box_processes_die_with_their_owner(kind: str) -> None:
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, kind],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert owner.stdout is not None
        box_id = owner.stdout.readline().strip()
        assert box_id, "the owner did not start its box"
        pids = [p for p in marked_pids(box_id) if not _dead(p)]
        # sh, its sleep and the setsid'd sleep (plus bwrap's own processes in a bwrap box)
        assert len(pids) >= 3, pids
    finally:
        owner.send_signal(signal.SIGKILL)  # no stop(), no finally, no atexit in the owner
        owner.wait()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and not all(_dead(p) for p in pids):
        time.sleep(0.05)
    assert [p for p in pids if not _dead(p)] == []
