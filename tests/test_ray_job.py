"""``ray job submit -- vfray eval …`` against a real Ray head started by this test (its own
temp dir and ports, on 127.0.0.1, Ray's token auth on with a token file of its own), stopped by
the PIDs it started. The job's driver joins that cluster under its settings; the head refuses
requests without the token; nothing of it listens beyond loopback."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pyarrow.parquet as pq
import pytest
from ray_head import Head, is_loopback, ray_cli, ray_head

# A head's start and two jobs' starts: ~110 s on a quiet 2-core machine, past 300 s on a
# loaded one (seen in CI).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def head() -> Iterator[Head]:
    """One head for this module's tests (each start costs tens of seconds here)."""
    with ray_head() as started:
        yield started


def test_head_refuses_requests_without_the_token(head: Head) -> None:
    jobs = f"{head.dashboard}/api/jobs/"
    assert httpx.get(jobs, timeout=30).status_code == 401
    wrong = {"Authorization": f"Bearer {'0' * 64}"}
    assert httpx.get(jobs, headers=wrong, timeout=30).status_code == 403
    right = {"Authorization": f"Bearer {head.token}"}
    assert httpx.get(jobs, headers=right, timeout=30).status_code == 200


def submit(head: Head, working_dir: Path, *args: str) -> subprocess.Popen[str]:
    """``ray job submit`` of ``vfray eval arithmetic … args`` from a fresh working dir."""
    working_dir.mkdir()
    (working_dir / "README.txt").write_text("uploaded by ray job submit\n")
    argv = [
        ray_cli(), "job", "submit", "--address", head.dashboard, "--working-dir", str(working_dir),
        *args[: args.index("--")], "--", "vfray", "eval", "arithmetic", "--harness", "null",
        "--no-progress", *args[args.index("--") + 1 :],
    ]  # fmt: skip
    return subprocess.Popen(
        argv, env=head.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def test_vfray_eval_as_ray_jobs_with_and_without_o(head: Head, tmp_path: Path) -> None:
    """Two jobs at once on one head (each job's start-up costs tens of seconds here):

    - with ``-o``: the run folder is there, complete, written by a driver that joined the job's
      cluster; what listens while it runs (the head's and the job's processes) is on loopback;
    - without ``-o``: the job's working dir is Ray's temporary copy, so run folders go to
      ``~/vfray-outputs`` (a durable place) and the printed path is absolute and still there
      after the job ended."""
    outputs = (tmp_path / "outputs").resolve()
    home = tmp_path / "home"
    runtime_env = json.dumps({"env_vars": {"HOME": str(home)}})
    seen: set[tuple[str, str, int]] = set()
    with (
        submit(head, tmp_path / "a", "--", "-n", "10", "-r", "2", "-o", str(outputs)) as job,
        submit(
            head, tmp_path / "b", "--runtime-env-json", runtime_env, "--", "-n", "3", "-r", "2"
        ) as durable,
    ):
        # While the job runs, its driver's actors (SandboxHost, the scripted model) are
        # processes of the head's raylet: sample what listens.
        deadline = time.monotonic() + 600
        while job.poll() is None and time.monotonic() < deadline:
            seen.update(head.listeners())
            time.sleep(0.3)
        for proc in (job, durable):
            try:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
        assert job.stdout is not None and durable.stdout is not None
        logs, durable_logs = job.stdout.read(), durable.stdout.read()

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

    commands = " ".join(cmd for cmd, _, _ in seen)
    for name in ("gcs_server", "raylet", "dashboard", "ray.util.client.server", "SandboxHost"):
        assert name in commands, (name, seen)
    exposed = sorted(row for row in seen if not is_loopback(row[1]))
    assert not exposed, f"listening beyond loopback: {exposed}"

    assert durable.returncode == 0, durable_logs[-5000:]
    assert "temporary working-dir copy" in durable_logs, durable_logs[-5000:]
    match = re.search(r"run folder: (\S+)", durable_logs)
    assert match, durable_logs[-5000:]
    durable_dir = Path(match.group(1))
    assert durable_dir.is_absolute()
    assert durable_dir.is_relative_to(home / "vfray-outputs")
    assert (durable_dir / "config.json").exists() and (durable_dir / "eval.log").exists()
