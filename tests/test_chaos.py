"""The fault mix, on the real Ray backend, in one run: a SandboxHost killed, the TraceSink
killed, a model outage, then the driver itself SIGKILLed and the run resumed.

Each fault is checked to have hit, and for what it did before the resume (which would hide
it): the killed actors' processes are gone; the attempts the dead host lost were held by the
dying sink and still reach the run folder as retried InfrastructureError rows; the rollouts the
outage failed are retried (ProviderError rows, then an ok attempt); every group in the folder is
whole and ok, nothing is written twice. After the driver kill its processes and its boxes'
work dirs and cgroups go (bwrap boxes, where bwrap is installed). The resume then runs exactly
the rollouts the folder lacks, and the result equals a clean run's pass@k. (A full disk, the
remaining fault of the mix, is tests/test_run_folder_recovery.py's, on both backends, with a
real tmpfs; docker containers left by a driver killed on Ray are
tests/test_driver_kill_docker.py's.)"""

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
from chaos_checks import (
    box_cgroups,
    box_dirs,
    folder_problems,
    gone,
    logged,
    marked,
    on_disk,
    owners_of,
    rows,
    watchdogs,
)

import vfray as vf
from vfray.testing import ScriptedModel, serve_in_thread

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


class ModelServer:
    """The scripted model, served from this process on a fixed port, so that an outage can be
    made by stopping it and starting it again on the same port, and the model's counters
    (requests received, completions answered) say what the run asked of it."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.model = ScriptedModel("arithmetic", latency=1.0, history_size=100_000)
        self._serving: contextlib.ExitStack | None = None

    def start(self) -> None:
        stack = contextlib.ExitStack()
        stack.enter_context(serve_in_thread(self.model, port=self.port))
        self._serving = stack

    def stop(self) -> None:
        if self._serving is not None:
            self._serving.close()
            self._serving = None

    def received(self) -> int:
        return len(self.model.history)


def eval_cmd(url: str, out: Path, *extra: str, concurrency: int = 4) -> list[str]:
    """``vfray eval`` of the run; 4 at a time by default, so that the faulted run (48 rollouts
    of 1 s model calls) still has rollouts in flight when each fault strikes."""
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
        str(concurrency),
        "--no-progress",
        *extra,
    ]


class TimedOut(AssertionError):
    """What :func:`wait_for` raises: told apart from an assertion the predicate itself made."""


def wait_for(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise TimedOut(f"timed out waiting for {what}")


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


RUNTIME = "bwrap" if shutil.which("bwrap") else "subprocess"
"""bwrap boxes (run as root: with cgroups) leave the most behind when their driver is killed."""


def test_fault_mix_then_resume_loses_and_duplicates_nothing(tmp_path: Path, temp: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    env = env_for(temp)
    model = ModelServer(port)
    model.start()
    try:
        clean_out = tmp_path / "clean"
        subprocess.run(
            # All at once: the clean run is only the reference pass@k (the scripted model answers
            # every prompt the same, however many are in flight).
            eval_cmd(url, clean_out, "--backend", "local", concurrency=TASKS * N),
            env=env,
            check=True,
            capture_output=True,
            timeout=300,
        )
        clean = vf.RunResult(run_dir_of(clean_out)).summary()
        run_faulted_then_resume(tmp_path, temp, env, url, model, clean)
    finally:
        model.stop()
    assert [p for p in marked(temp) if "serve-model" not in p] == []


def run_faulted_then_resume(
    tmp_path: Path,
    temp: Path,
    env: dict[str, str],
    url: str,
    model: ModelServer,
    clean: dict[str, Any],
) -> None:
    out = tmp_path / "chaos"
    # The driver's output goes to a file: a pipe nobody reads could fill and stall it, and
    # the file says what the driver did when a step below fails. Rows are flushed every 2 s,
    # so that what the faults made reaches the folder before the driver is killed.
    log_path = tmp_path / "driver.log"
    with log_path.open("w") as log_file:
        driver = subprocess.Popen(
            eval_cmd(url, out, "--runtime", RUNTIME, "--farm.flush_seconds", "2"),
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def driver_log() -> str:
        return log_path.read_text(errors="replace")[-3000:]

    def actor(name: str) -> int | None:
        for pid, cmd in descendants(driver.pid).items():
            if cmd.startswith(f"ray::{name}"):
                return pid
        return None

    def kill_actor(name: str) -> int:
        """SIGKILL the actor's current process; returns its PID. Found again right before the
        kill: under load Ray may still be replacing a worker, and a PID seen earlier can be
        gone."""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert driver.poll() is None, f"the driver exited early:\n{driver_log()}"
            pid = actor(name)
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    wait_for(lambda p=pid: gone(p), 30, f"the killed {name} to die")
                    return pid
            time.sleep(0.2)
        raise AssertionError(f"no {name} process to kill:\n{driver_log()}")

    try:
        wait_for(lambda: actor("SandboxHost"), 120, "the SandboxHost")
        wait_for(lambda: out.exists() and list(out.glob("*/*/config.json")), 60, "run dir")
        run_dir = run_dir_of(out)
        time.sleep(2.0)
        kill_actor("SandboxHost")  # a host dies with rollouts in flight
        # The driver logs each attempt the dead host lost, then sends its row to the sink: the
        # sink dies right then, holding those rows (and the groups it had not flushed).
        wait_for(lambda: logged(run_dir)["lost"], 60, "the driver to log a lost attempt")
        kill_actor("TraceSink")
        lost_at_sink_death = logged(run_dir)["lost"]
        held = lost_at_sink_death - on_disk(rows(run_dir)[0], "InfrastructureError")
        # The outage must find rollouts calling: under load (three test workers on two cores)
        # the host Ray started again took longer than the outage, which then hit no call.
        received = model.received()
        wait_for(lambda: model.received() > received, 120, "a rollout to call the model again")
        answered = model.model.calls
        model.stop()  # a model outage of a few seconds
        time.sleep(4.0)
        model.start()
        # The outage hit: requests came in again after it (the rollouts it failed, retried).
        wait_for(lambda: model.model.calls > answered, 60, "the model to be asked again")

        def settled() -> bool:
            """The faults' retried attempts the driver has logged are all in the folder (and
            what is there already is right: a rollout the model failed ended retried)."""
            problems = folder_problems(run_dir, N, running=True)
            assert problems == [], problems
            seen = logged(run_dir)
            traces = rows(run_dir)[0]
            provider = seen["failed"].get("ProviderError", set())
            return bool(
                seen["resent"]
                and provider
                and seen["lost"] <= on_disk(traces, "InfrastructureError")
                and provider <= on_disk(traces, "ProviderError")
            )

        try:
            wait_for(settled, 60, "the retried attempts to reach the run folder")
        except TimedOut:
            problems = folder_problems(run_dir, N, running=True)
            assert problems == [], problems
            seen = logged(run_dir)
            traces = rows(run_dir)[0]
            raise AssertionError(
                "the faults' retried attempts never all reached the run folder: "
                f"lost (logged {sorted(seen['lost'])}, on disk "
                f"{sorted(on_disk(traces, 'InfrastructureError'))}; held by the dead sink "
                f"{sorted(held)}), ProviderError (logged "
                f"{sorted(seen['failed'].get('ProviderError', set()))}, on disk "
                f"{sorted(on_disk(traces, 'ProviderError'))}), sink re-sent {seen['resent']}"
                f"\n{driver_log()}"
            ) from None
        dirs = box_dirs(temp)
        cgroups = box_cgroups(owners_of(dirs))
        assert driver.poll() is None, f"the run ended before its driver was killed:\n{driver_log()}"
        os.kill(driver.pid, signal.SIGKILL)  # and finally the driver itself
        driver.wait(timeout=60)
    finally:
        if driver.poll() is None:
            driver.kill()
    print(
        f"chaos: lost {sorted(lost_at_sink_death)} (held by the dead sink {sorted(held)}), "
        f"provider failures {logged(run_dir)['failed']}, re-sent {logged(run_dir)['resent']}, "
        f"boxes at the driver kill: {len(dirs)} dirs, {len(cgroups)} cgroups"
    )
    problems = folder_problems(run_dir, N)
    assert problems == [], problems
    traces, _ = rows(run_dir)
    done_before = len({(r["task_key"], r["rollout_index"]) for r in traces if r["ok"]})
    assert done_before < TASKS * N, "the driver was killed before the run finished"

    # What the dead driver left: its processes, its boxes' work dirs and cgroups. The hosts'
    # watchdogs reap them once the driver's watchdog has killed the hosts.
    assert dirs, "no box was live when the driver was killed: the test shows nothing"

    def leftovers() -> list[str]:
        processes = [p for p in marked(temp) if "serve-model" not in p]
        return processes + sorted(box_dirs(temp)) + sorted(c for c in cgroups if Path(c).exists())

    with contextlib.suppress(AssertionError):
        wait_for(lambda: not leftovers(), 60, "what the dead driver left to go")
    assert leftovers() == [], f"outlived their SIGKILLed driver (watchdogs: {watchdogs()})"

    resumed = subprocess.run(
        [*vfray_cli(), "resume", str(run_dir), "--no-progress"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    # The resume ran exactly the rollouts the faulted run had not finished.
    assert logged(run_dir)["resumed"] == [TASKS * N - done_before]
    check_complete(run_dir, clean)
    # The resume's lifeline watchdog outlives it by the moment its reaping takes. Its boxes go
    # at its close: the warm ones its hosts had parked too (a killed actor runs no atexit, and
    # Ray killed the hosts' watchdogs with them, so they stayed before).
    with contextlib.suppress(AssertionError):
        wait_for(lambda: not leftovers(), 60, "the resume's processes and boxes to go")
    assert leftovers() == [], "left by the resume"
