"""Harness programs go through ``Popen`` and a pidfd (:mod:`vfray.runtimes._spawn`) on the stdlib
loop and on uvloop (the loop of a Ray async actor): the same results on both, no full ``fork()``
of the host process, every pipe closed once (uvloop closed ``Popen``'s pipes twice, which can
close a descriptor another thread has just opened), and a spawn cancelled as ``asyncio.run``
exits does not hang it (the stdlib's own ``create_subprocess_exec`` did, CPython gh-125502)."""

from __future__ import annotations

import asyncio
import gc
import os
import shutil
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from vfray.runtimes._spawn import PopenProcess, uses_loop_subprocess
from vfray.runtimes.processes import run_process_group, start_live
from vfray.runtimes.subprocess import SubprocessRuntime

uvloop = pytest.importorskip("uvloop")

_forks = {"n": 0}
os.register_at_fork(after_in_parent=lambda: _forks.__setitem__("n", _forks["n"] + 1))


LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "stdlib": asyncio.new_event_loop,
    "uvloop": uvloop.new_event_loop,
}


@pytest.fixture(params=sorted(LOOPS))
def loop_name(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


def on_loop(name: str, make: Callable[[], Awaitable[Any]]) -> Any:
    with asyncio.Runner(loop_factory=LOOPS[name]) as runner:
        return runner.run(make())  # type: ignore[arg-type]


def run_group(loop: str, argv: list[str], **kwargs: Any) -> Any:
    async def go() -> Any:
        assert not uses_loop_subprocess()
        return await run_process_group(
            argv,
            {"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
            os.getcwd(),
            on_start=lambda pgid: None,
            preexec_fn=None,
            **{"timeout": None, "stdin": None, **kwargs},
        )

    return on_loop(loop, go)


def test_exit_code_output_and_stdin_without_a_fork(loop_name: str) -> None:
    forks = _forks["n"]
    code = "import sys; print(sys.stdin.read().upper()); print('e', file=sys.stderr); sys.exit(3)"
    result = run_group(loop_name, [sys.executable, "-c", code], stdin=b"hi")
    assert (result.exit_code, result.stdout, result.stderr) == (3, "HI\n", "e\n")
    assert _forks["n"] == forks  # vfork: Python's at-fork handlers never ran


def test_timeout_kills_the_group(loop_name: str) -> None:
    result = run_group(
        loop_name, [sys.executable, "-c", "import time; time.sleep(60)"], timeout=0.5
    )
    assert result.timed_out
    assert result.exit_code < 0


def test_missing_program_is_reported_like_a_shell(loop_name: str) -> None:
    assert run_group(loop_name, ["/nonexistent/program"]).exit_code == 127


def test_live_process_streams_and_stops(loop_name: str) -> None:
    async def go() -> tuple[bytes, int, bool]:
        code = "import sys\nfor line in sys.stdin: print(line.strip()[::-1], flush=True)"
        proc = await start_live(
            [sys.executable, "-c", code], {"PATH": "/usr/bin:/bin"}, os.getcwd(), preexec_fn=None
        )
        assert proc.pid is not None
        proc.stdin.write(b"abc\n")
        await proc.stdin.drain()
        line = await proc.stdout.readline()
        status = await proc.stop(grace=5)
        return line, status, isinstance(proc._proc, PopenProcess)

    line, status, popen = on_loop(loop_name, go)
    assert line == b"cba\n"
    assert popen
    assert isinstance(status, int)


def test_subprocess_runtime_runs_a_program_that_signals_ready(loop_name: str) -> None:
    async def go() -> Any:
        box = SubprocessRuntime(launch_concurrency=1)
        await box.start()
        try:
            code = "import os; os.write(int(os.environ['VFRAY_READY_FD']), b'1'); print('up')"
            return await box.run_program([sys.executable, "-c", code], signals_ready=True)
        finally:
            await box.stop()

    result = on_loop(loop_name, go)
    assert (result.exit_code, result.stdout) == (0, "up\n")


SPAWNS = """
import asyncio, os, sys
import uvloop
LOOP = {"stdlib": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}[sys.argv[1]]
from vfray.runtimes.processes import run_process_group, start_live

async def main():
    env = {"PATH": "/usr/bin:/bin"}
    code = "import sys; sys.stdout.write(sys.stdin.read()); print('e', file=sys.stderr)"
    for _ in range(5):
        result = await run_process_group(
            [sys.executable, "-c", code], env, os.getcwd(), timeout=30, stdin=b"hi",
            preexec_fn=None, on_start=lambda pgid: None,
        )
        assert (result.exit_code, result.stdout, result.stderr) == (0, "hi", "e\\n"), result
    proc = await start_live(["/bin/cat"], env, os.getcwd(), preexec_fn=None)
    proc.stdin.write(b"x\\n")
    await proc.stdin.drain()
    assert await proc.stdout.readline() == b"x\\n"
    await proc.stop(grace=5)
    os.write(1, b"done\\n")

with asyncio.Runner(loop_factory=LOOP) as runner:
    runner.run(main())
"""


def test_every_pipe_is_closed_once(tmp_path: Any, loop_name: str) -> None:
    """Under ``strace``: no ``close`` of the host process fails with EBADF (a descriptor closed
    a second time). uvloop closed each of ``Popen``'s pipes twice: 3 EBADFs per program."""
    strace = shutil.which("strace")
    if strace is None or subprocess.run([strace, "-o", os.devnull, "true"]).returncode != 0:
        pytest.skip("strace (Debian's strace) is not installed or cannot trace here")
    script = tmp_path / "spawns.py"
    script.write_text(textwrap.dedent(SPAWNS))
    log = tmp_path / "close.log"
    # Only the host process's own calls (no -f): its children exec at once.
    done = subprocess.run(
        [strace, "-e", "trace=close", "-o", str(log), sys.executable, str(script), loop_name],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout.endswith("done\n"), done.stderr[-2000:]
    closes = log.read_text().splitlines()
    assert len(closes) > 30  # the run's pipes, pidfds and files were seen being closed
    assert [line for line in closes if "EBADF" in line] == []


def test_spawning_leaks_no_descriptor(loop_name: str) -> None:
    """Every pipe is closed when the program is done with, not by the garbage collector: a
    reader's transport stays open after EOF on uvloop, and in a Ray actor the collector runs
    off the loop's thread, where uvloop cannot close it (~950 read ends leaked in one
    SandboxHost over 1,040 rollouts). So: no new descriptor after the programs, gc off."""

    def open_fds() -> set[int]:
        # listdir's own descriptor is open while it lists, in both sets alike.
        return {int(fd) for fd in os.listdir("/proc/self/fd")}

    async def spawn(argv: list[str]) -> Any:
        env = {"PATH": "/usr/bin:/bin"}
        return await run_process_group(
            argv, env, os.getcwd(), timeout=30, stdin=b"", preexec_fn=None, on_start=print
        )

    async def live() -> None:
        proc = await start_live(
            ["/bin/cat"], {"PATH": "/usr/bin:/bin"}, os.getcwd(), preexec_fn=None
        )
        await proc.stop(grace=5)

    async def go() -> tuple[set[int], set[int]]:
        await spawn([sys.executable, "-c", "pass"])  # the loop's own first-use descriptors
        await asyncio.sleep(0.1)
        gc.collect()
        gc.disable()
        try:
            before = open_fds()
            for _ in range(3):
                assert (await spawn([sys.executable, "-c", "print('x')"])).stdout == "x\n"
            assert (await spawn(["/nonexistent/program"])).exit_code == 127
            await live()
            await asyncio.sleep(0.1)  # the transports' close callbacks
            return before, open_fds()
        finally:
            gc.enable()

    before, after = on_loop(loop_name, go)
    assert after == before


CANCELLED_AT_EXIT = """
import asyncio, os, sys
import uvloop
from vfray.runtimes.processes import run_process_group

LOOP = {"stdlib": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}[sys.argv[1]]

async def main():
    # Each program leaves a background process: none may outlive the cancelled spawn.
    for _ in range(4):
        asyncio.ensure_future(run_process_group(
            ["sh", "-c", "sleep 60 & sleep 60"], {"PATH": os.environ["PATH"], **MARK}, "/",
            timeout=None, stdin=b"", preexec_fn=None, on_start=lambda pgid: None))
    for _ in range(int(sys.argv[2])):
        await asyncio.sleep(0)

MARK = {"VFRAY_TEST_SPAWN_MARK": sys.argv[3]}
with asyncio.Runner(loop_factory=LOOP) as runner:
    runner.run(main())  # returns at once: the runner cancels the four spawns mid-way
print("exited", flush=True)
"""


@pytest.mark.parametrize("turns", [0, 1, 2, 3])
def test_a_spawn_cancelled_as_asyncio_run_exits_neither_hangs_nor_leaks(
    tmp_path: Any, loop_name: str, turns: int
) -> None:
    """``asyncio.run`` cancels every task when its main coroutine returns: four spawns caught
    0-3 loop turns after they began. With the stdlib's ``create_subprocess_exec`` the process
    never exited for 0-3 turns (the pipes' connecting task is cancelled too, and nothing wakes
    the spawn's clean-up); here it exits, and every program (and what it started) is gone."""
    script = tmp_path / "cancelled.py"
    script.write_text(textwrap.dedent(CANCELLED_AT_EXIT))
    mark = uuid.uuid4().hex
    done = subprocess.run(
        [sys.executable, str(script), loop_name, str(turns), mark],
        capture_output=True,
        text=True,
        timeout=60,  # a hang guard: the run takes well under a second
    )
    assert done.returncode == 0 and done.stdout == "exited\n", done.stderr[-2000:]
    deadline = time.monotonic() + 10
    while (left := _marked(mark)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert left == []


def _marked(mark: str) -> list[int]:
    from vfray.runtimes._reap import env_pids

    return env_pids("VFRAY_TEST_SPAWN_MARK").get(mark, [])
