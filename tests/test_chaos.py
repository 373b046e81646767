"""The fault mix, on the real Ray backend, in one run: a SandboxHost killed, the TraceSink
killed, a model outage, then the driver itself SIGKILLed and the run resumed. Afterwards every
rollout is accounted for, no row is duplicated in ``traces/`` or ``episodes/``, pass@k equals a
clean run's, and no process is left behind. (A full disk, the remaining fault of the mix, is
tests/test_run_folder_recovery.py's, on both backends, with a real tmpfs.)"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import vfray as vf

pytestmark = pytest.mark.slow

TASKS, N = 24, 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def vfray_cli() -> list[str]:
    return [sys.executable, "-m", "vfray"]


def _table() -> dict[int, tuple[int, str]]:
    found: dict[int, tuple[int, str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        found[int(entry.name)] = (int(stat.rsplit(")", 1)[1].split()[1]), cmd)
    return found


def descendants(root: int) -> dict[int, str]:
    table = _table()
    ours = {root}
    grew = True
    while grew:
        more = {pid for pid, (ppid, _) in table.items() if ppid in ours} - ours
        grew = bool(more)
        ours |= more
    return {pid: table[pid][1] for pid in ours if pid in table}


def marked(temp: Path) -> list[str]:
    """Processes whose command line, working directory or environment name ``temp``: the
    run's Ray processes (TMPDIR), its boxes and harness programs."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
            env = Path(f"/proc/{entry}/environ").read_bytes()
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except OSError:
            continue
        if str(temp).encode() in cmd + env or cwd.startswith(str(temp)):
            found.append(f"{entry}: {cmd[:120].decode(errors='replace')}")
    return found


@contextlib.contextmanager
def model_server(port: int) -> Iterator[dict[str, subprocess.Popen[str]]]:
    """The scripted model as its own process on a fixed port, so an outage can be made by
    stopping it and restarting it on the same port."""
    box: dict[str, subprocess.Popen[str]] = {}

    def start() -> None:
        box["proc"] = subprocess.Popen(
            [
                *vfray_cli(),
                "serve-model",
                "--policy",
                "arithmetic",
                "--latency",
                "1.0",
                "--port",
                str(port),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert box["proc"].stdout is not None
        box["proc"].stdout.readline()  # "serving at …" once listening

    start()
    box["restart"] = start  # type: ignore[assignment]
    try:
        yield box
    finally:
        box["proc"].terminate()
        box["proc"].wait(timeout=30)


def eval_cmd(url: str, out: Path, *extra: str) -> list[str]:
    return [
        *vfray_cli(),
        "eval",
        "arithmetic",
        "-n",
        str(TASKS),
        "-r",
        str(N),
        "--harness",
        "null",
        "-m",
        "scripted",
        "--base-url",
        url,
        "-o",
        str(out),
        "-c",
        "4",
        "--no-progress",
        *extra,
    ]


def wait_for(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def run_dir_of(out: Path) -> Path:
    (run_dir,) = [p.parent for p in out.glob("*/*/config.json")]
    return run_dir


def check_complete(run_dir: Path, clean: dict[str, Any]) -> None:
    result = vf.RunResult(run_dir)
    traces = result.traces.to_pylist()
    attempts = [(r["task_key"], r["rollout_index"], r["attempt"]) for r in traces]
    assert len(attempts) == len(set(attempts)), "a rollout attempt was written twice"
    final = result.final_traces.to_pylist()
    assert len(final) == TASKS * N, "every rollout is accounted for"
    assert all(r["ok"] for r in final), [r["error"] for r in final if not r["ok"]][:3]
    episodes = result.episodes.to_pylist()
    keys = [r["task_key"] for r in episodes]
    assert len(keys) == len(set(keys)) == TASKS, "one episode row per task"
    summary = result.summary()
    for name, value in clean.items():
        if name.startswith("pass@"):
            assert summary[name] == pytest.approx(value), name


@pytest.fixture
def temp() -> Iterator[Path]:
    # Short: Ray's unix socket paths under TMPDIR must stay below 108 bytes.
    path = Path(tempfile.mkdtemp(prefix="vfc-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def env_for(temp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "VFRAY_"))}
    env["TMPDIR"] = str(temp)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def test_fault_mix_then_resume_loses_and_duplicates_nothing(tmp_path: Path, temp: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    env = env_for(temp)
    with model_server(port) as model:
        clean_out = tmp_path / "clean"
        subprocess.run(
            eval_cmd(url, clean_out, "--backend", "local"),
            env=env,
            check=True,
            capture_output=True,
            timeout=300,
        )
        clean = vf.RunResult(run_dir_of(clean_out)).summary()

        out = tmp_path / "chaos"
        # The driver's output goes to a file: a pipe nobody reads could fill and stall it, and
        # the file says what the driver did when a step below fails.
        log_path = tmp_path / "driver.log"
        with log_path.open("w") as log_file:
            driver = subprocess.Popen(
                eval_cmd(url, out), env=env, stdout=log_file, stderr=subprocess.STDOUT, text=True
            )

        def driver_log() -> str:
            return log_path.read_text(errors="replace")[-3000:]

        def actor(name: str) -> int | None:
            for pid, cmd in descendants(driver.pid).items():
                if cmd.startswith(f"ray::{name}"):
                    return pid
            return None

        def kill_actor(name: str) -> None:
            """SIGKILL the actor's current process. Found again right before the kill: under
            load Ray may still be replacing a worker, and a PID seen earlier can be gone."""
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                assert driver.poll() is None, f"the driver exited early:\n{driver_log()}"
                pid = actor(name)
                if pid is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                        return
                time.sleep(0.2)
            raise AssertionError(f"no {name} process to kill:\n{driver_log()}")

        try:
            wait_for(lambda: actor("SandboxHost"), 120, "the SandboxHost")
            wait_for(lambda: out.exists() and list(out.glob("*/*/config.json")), 60, "run dir")
            time.sleep(2.0)
            kill_actor("SandboxHost")  # a host dies with rollouts in flight
            wait_for(lambda: actor("TraceSink"), 60, "the TraceSink")
            time.sleep(1.5)
            kill_actor("TraceSink")  # the sink dies with rows buffered
            time.sleep(1.0)
            model["proc"].terminate()  # a model outage of a few seconds
            model["proc"].wait(timeout=30)
            time.sleep(4.0)
            model["restart"]()  # type: ignore[operator]
            time.sleep(3.0)
            if driver.poll() is None:
                os.kill(driver.pid, signal.SIGKILL)  # and finally the driver itself
            driver.wait(timeout=60)
        finally:
            if driver.poll() is None:
                driver.kill()
        run_dir = run_dir_of(out)
        before = vf.RunResult(run_dir)
        done_before = sum(before.final_traces.column("ok").to_pylist())
        assert done_before < TASKS * N, "the driver was killed before the run finished"

        # Ray's own processes die with their driver; give them a moment.
        def leftovers() -> list[str]:
            return [p for p in marked(temp) if "serve-model" not in p]

        with contextlib.suppress(AssertionError):
            wait_for(lambda: not leftovers(), 60, "the dead driver's processes to go")
        assert leftovers() == [], "processes outlived their SIGKILLed driver"
        resumed = subprocess.run(
            [*vfray_cli(), "resume", str(run_dir), "--no-progress"],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
        check_complete(run_dir, clean)
        # The resume's lifeline watchdog outlives it by the moment its reaping takes.
        with contextlib.suppress(AssertionError):
            wait_for(lambda: not leftovers(), 60, "the resume's processes to go")
    assert [p for p in marked(temp) if "serve-model" not in p] == []
