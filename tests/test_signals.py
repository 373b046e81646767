"""Stopping a run the way schedulers stop jobs: ``vfray eval`` started as a job step (a session
of its own, SIGINT ignored as ``cmd &`` hands it down, a subreaper parent that sees every
process it leaves behind) gets SIGTERM mid-run, on the local backend and on Ray; a Ctrl-C
(SIGINT) stops a plain run the same way. Each must end with rc 143 / 130, the run folder and
the ``vfray resume`` command printed, no rollout recorded as failed because of the stop, no
process left, and ``vfray resume`` must complete the run, its progress counting the whole run.
Progress is on, as a user runs it: what it prints while Ray starts and while the stop is handled
must not break either."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.test_cli import as_from_a_terminal, cli_env, signal_state

TASKS, GROUP = 12, 2


def _start(
    tmp_path: Path, backend: str, *, scheduled: bool
) -> tuple[subprocess.Popen[str], list[str]]:
    argv = [
        sys.executable, "-m", "vfray", "eval", "arithmetic", "-n", str(TASKS), "-r", str(GROUP),
        "--backend", backend, "--harness", "null", "-o", str(tmp_path),
        "-m", "scripted:arithmetic?latency=2", "-c", "4",
    ]  # fmt: skip
    if scheduled:
        argv = [sys.executable, "-m", "tests.scheduled_job", "--", *argv]
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
        cwd=Path(__file__).parent.parent,
        preexec_fn=as_from_a_terminal,
    )
    err: list[str] = []
    assert proc.stderr is not None
    stream = proc.stderr
    threading.Thread(target=lambda: err.extend(stream), daemon=True).start()
    return proc, err


def _wait_in_flight(tmp_path: Path, proc: subprocess.Popen[str], err: list[str]) -> Path:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        found = sorted(tmp_path.glob("*/*/config.json"))
        if found:
            time.sleep(3)  # the first groups done, others in flight (2 s per model call)
            return found[0].parent
        time.sleep(0.2)
    raise AssertionError("".join(err)[-3000:])


def _failed_rows(folder: Path) -> list[str]:
    rows: list[str] = []
    for part in sorted((folder / "traces").glob("*.parquet")):
        table = pq.read_table(part, columns=["ok", "error_type", "error_message"])
        for row in table.to_pylist():
            if not row["ok"] or row["error_type"]:
                rows.append(f"{row['error_type']}: {row['error_message']}")
    return rows


@pytest.mark.parametrize(
    ("backend", "sig", "scheduled"),
    [
        ("local", signal.SIGTERM, True),
        ("local", signal.SIGINT, False),
        ("ray", signal.SIGTERM, True),
    ],
    ids=["local-sigterm-job", "local-ctrl-c", "ray-sigterm-job"],
)
def test_a_signal_stops_the_run_cleanly_and_resume_completes_it(
    tmp_path: Path, backend: str, sig: signal.Signals, scheduled: bool
) -> None:
    proc, err = _start(tmp_path, backend, scheduled=scheduled)
    folder = _wait_in_flight(tmp_path, proc, err)
    if scheduled:
        job = next(int(line.split()[1]) for line in err if line.startswith("JOB "))
        os.kill(job, sig)  # the job itself, as kill / Kubernetes / ray job stop do
    else:
        proc.send_signal(sig)
    code = proc.wait(timeout=300)
    time.sleep(0.5)  # the reader thread drains the pipe
    text = "".join(err)
    assert code == 128 + sig, f"{signal_state()}\n{text[-3000:]}"
    # No stack, and none of Ray's crash lines ("*** SIGTERM received ..." from a worker).
    assert "Traceback" not in text and "SIGTERM received" not in text and "*** " not in text, text
    assert f"run folder: {folder}" in text and f"resume with: vfray resume {folder}" in text
    if backend == "ray":
        assert "starting a local Ray" in text  # said while Ray starts
    if scheduled:
        left = json.loads(
            next(line for line in err if line.startswith("LEFTOVER ")).split(" ", 1)[1]
        )
        assert left == [], left
    # A rollout cut by the stop is not a result: it is re-run by resume, not kept as an error.
    assert _failed_rows(folder) == []
    resumed = subprocess.run(
        [sys.executable, "-m", "vfray", "resume", str(folder)],
        capture_output=True, text=True, env=cli_env(), timeout=300, check=False,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    total = TASKS * GROUP
    assert f"{total} / {total}" in resumed.stdout, resumed.stdout
    # The progress line counts what the run already held, not only the resumed part.
    lines = [line for line in resumed.stderr.splitlines() if line.startswith("rollouts ")]
    assert lines and lines[-1].startswith(f"rollouts {total}/{total}"), resumed.stderr
    assert _failed_rows(folder) == []


def test_a_run_stopped_before_its_first_row_is_stopped_at_once_and_resumes(
    tmp_path: Path,
) -> None:
    """SIGTERM while every rollout's model call is still in flight (the model answers after
    8 s): the servers cancel those calls instead of waiting out their 5 s graceful shutdown
    each (uvicorn's "Cancel N running task(s), timeout graceful shutdown exceeded" ERROR line
    twice, and a 12 s stop, before). The folder then has its config.json and no traces/ yet:
    ``vfray show`` reads it as a run with no rows, and ``vfray resume`` runs it whole."""
    argv = [
        sys.executable, "-m", "vfray", "eval", "arithmetic", "-n", "2", "-r", "1",
        "--backend", "local", "--harness", "null", "-o", str(tmp_path),
        "-m", "scripted:arithmetic?latency=8", "-c", "2", "--no-progress",
    ]  # fmt: skip
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env()
    )
    deadline = time.monotonic() + 120
    while not (found := sorted(tmp_path.glob("*/*/config.json"))):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    folder = found[0].parent
    time.sleep(1.0)  # the two calls are at the model
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "graceful shutdown" not in err and "ERROR" not in err, err
    assert f"resume with: vfray resume {folder}" in err
    assert not (folder / "traces").exists(), "a row was written before the stop: no test"
    shown = subprocess.run(
        [sys.executable, "-m", "vfray", "show", str(folder)],
        capture_output=True, text=True, env=cli_env(), timeout=120, check=False,
    )  # fmt: skip
    assert shown.returncode == 0 and "0 / 0" in shown.stdout, shown.stderr
    resumed = subprocess.run(
        [sys.executable, "-m", "vfray", "resume", str(folder), "--no-progress"],
        capture_output=True, text=True, env=cli_env(), timeout=300, check=False,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "2 / 2" in resumed.stdout, resumed.stdout
    assert _failed_rows(folder) == []
