"""``ray job submit -- vfray eval …`` against a real Ray head started by this test (its own
temp dir and ports, on 127.0.0.1, token auth off), stopped by the PIDs it started."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def ray_cli() -> str:
    beside = Path(sys.executable).parent / "ray"
    found = str(beside) if beside.exists() else shutil.which("ray")
    if found is None:
        pytest.skip("the ray command is not installed")
    return found


def ray_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "VFRAY_"))}
    env.update(RAY_AUTH_MODE="disabled", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    return env


def _processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line), read from /proc."""
    found: dict[int, tuple[int, str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name in stat may contain spaces; the parent pid follows its ")".
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        found[int(entry.name)] = (ppid, cmdline)
    return found


def processes_of(marker: str) -> set[int]:
    """Processes whose command line names ``marker`` (our temp dir), and all their
    descendants (Ray workers rename themselves ``ray::…`` and lose the marker)."""
    table = _processes()
    ours = {pid for pid, (_, cmd) in table.items() if marker in cmd and pid != os.getpid()}
    grew = True
    while grew:
        children = {pid for pid, (ppid, _) in table.items() if ppid in ours} - ours
        grew = bool(children)
        ours |= children
    return ours


def kill_all(pids: set[int]) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in pids):
            time.sleep(0.2)
        pids = {p for p in pids if Path(f"/proc/{p}").exists()}
        if not pids:
            return


@pytest.fixture
def ray_head() -> Iterator[str]:
    """A head node on loopback with a dashboard (the job API); yields the dashboard URL."""
    temp_dir = tempfile.mkdtemp(prefix="vfrj", dir="/tmp")  # short: unix socket paths
    dashboard = free_port()
    ports = {
        "--port": free_port(),
        "--dashboard-port": dashboard,
        "--ray-client-server-port": free_port(),
        "--dashboard-agent-listen-port": free_port(),
        "--dashboard-agent-grpc-port": free_port(),
        "--metrics-export-port": free_port(),
        "--runtime-env-agent-port": free_port(),
    }
    argv = [
        ray_cli(), "start", "--head", "--node-ip-address=127.0.0.1", f"--temp-dir={temp_dir}",
        "--num-cpus=2", "--include-dashboard=true", "--dashboard-host=127.0.0.1",
        *(f"{flag}={port}" for flag, port in ports.items()),
    ]  # fmt: skip
    try:
        started = subprocess.run(
            argv, env=ray_env(), capture_output=True, text=True, timeout=180, check=False
        )
        assert started.returncode == 0, started.stdout[-3000:] + started.stderr[-3000:]
        yield f"http://127.0.0.1:{dashboard}"
    finally:
        # Never `ray stop`: it would stop every Ray on the machine. Only what we started.
        kill_all(processes_of(temp_dir))
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_vfray_eval_as_a_ray_job(ray_head: str, tmp_path: Path) -> None:
    working_dir = tmp_path / "project"
    working_dir.mkdir()
    (working_dir / "README.txt").write_text("uploaded by ray job submit\n")
    outputs = (tmp_path / "outputs").resolve()
    job = subprocess.run(
        [
            ray_cli(), "job", "submit", "--address", ray_head, "--working-dir", str(working_dir),
            "--", "vfray", "eval", "arithmetic", "-n", "10", "-r", "2", "--harness", "null",
            "-o", str(outputs), "--no-progress",
        ],
        env=ray_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )  # fmt: skip
    logs = job.stdout + job.stderr
    assert job.returncode == 0, logs[-5000:]
    assert "succeeded" in logs, logs[-5000:]
    match = re.search(r"run folder: (\S+)", logs)
    assert match, logs[-5000:]
    run_dir = Path(match.group(1))
    assert run_dir.parent.parent == outputs
    rows = sum(pq.read_metadata(p).num_rows for p in (run_dir / "traces").glob("*.parquet"))
    episodes = sum(pq.read_metadata(p).num_rows for p in (run_dir / "episodes").glob("*.parquet"))
    assert (rows, episodes) == (20, 10)
    assert "20 / 20" in logs
    assert (run_dir / "config.json").exists()
    # The driver joined the job's cluster (RAY_ADDRESS) instead of starting its own Ray.
    assert "started a local Ray" not in (run_dir / "eval.log").read_text()
