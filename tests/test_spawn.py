"""Harness programs started from uvloop (the loop of a Ray async actor) go through ``Popen`` and a
pidfd (:mod:`vfray.runtimes._spawn`): the same results as from the stdlib loop, no full
``fork()`` of the host process, and every pipe closed once (uvloop closed ``Popen``'s pipes
twice, which can close a descriptor another thread has just opened)."""

from __future__ import annotations

import asyncio
import gc
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from vfray.runtimes._spawn import PopenProcess, uses_stdlib_subprocess
from vfray.runtimes.processes import run_process_group, start_live
from vfray.runtimes.subprocess import SubprocessRuntime

uvloop = pytest.importorskip("uvloop")

_forks = {"n": 0}
os.register_at_fork(after_in_parent=lambda: _forks.__setitem__("n", _forks["n"] + 1))


def on_uvloop(make: Callable[[], Awaitable[Any]]) -> Any:
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(make())  # type: ignore[arg-type]


def run_group(argv: list[str], **kwargs: Any) -> Any:
    async def go() -> Any:
        assert not uses_stdlib_subprocess(asyncio.get_running_loop())
        return await run_process_group(
            argv,
            {"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
            os.getcwd(),
            on_start=lambda pgid: None,
            preexec_fn=None,
            **{"timeout": None, "stdin": None, **kwargs},
        )

    return on_uvloop(go)


def test_exit_code_output_and_stdin_without_a_fork() -> None:
    forks = _forks["n"]
    code = "import sys; print(sys.stdin.read().upper()); print('e', file=sys.stderr); sys.exit(3)"
    result = run_group([sys.executable, "-c", code], stdin=b"hi")
    assert (result.exit_code, result.stdout, result.stderr) == (3, "HI\n", "e\n")
    assert _forks["n"] == forks  # vfork: Python's at-fork handlers never ran


def test_timeout_kills_the_group() -> None:
    result = run_group([sys.executable, "-c", "import time; time.sleep(60)"], timeout=0.5)
    assert result.timed_out
    assert result.exit_code < 0


def test_missing_program_is_reported_like_a_shell() -> None:
    assert run_group(["/nonexistent/program"]).exit_code == 127


def test_live_process_streams_and_stops() -> None:
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

    line, status, popen = on_uvloop(go)
    assert line == b"cba\n"
    assert popen
    assert isinstance(status, int)


def test_subprocess_runtime_runs_a_program_that_signals_ready() -> None:
    async def go() -> Any:
        box = SubprocessRuntime(launch_concurrency=1)
        await box.start()
        try:
            code = "import os; os.write(int(os.environ['VFRAY_READY_FD']), b'1'); print('up')"
            return await box.run_program([sys.executable, "-c", code], signals_ready=True)
        finally:
            await box.stop()

    result = on_uvloop(go)
    assert (result.exit_code, result.stdout) == (0, "up\n")


SPAWNS = """
import asyncio, os, sys
import uvloop
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

uvloop.run(main())
"""


def test_every_pipe_is_closed_once(tmp_path: Any) -> None:
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
        [strace, "-e", "trace=close", "-o", str(log), sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout.endswith("done\n"), done.stderr[-2000:]
    closes = log.read_text().splitlines()
    assert len(closes) > 30  # the run's pipes, pidfds and files were seen being closed
    assert [line for line in closes if "EBADF" in line] == []


def test_spawning_leaks_no_descriptor() -> None:
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

    before, after = on_uvloop(go)
    assert after == before
