"""Shared plumbing of the vfray-vs-verifiers benchmarks: the verifiers virtualenv, the shared
scripted model server, launching each side's eval CLI (vfray on its Ray backend, vfray on its
local backend, verifiers) as a measured subprocess (wall time, process-tree RSS), and reading
back the finish times of its traces.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
VF_SIDE = HERE / "vf_side"
VENV = Path(os.environ.get("VFBENCH_VENV", "/opt/verifiers-venv"))
VF_VERSION = "0.4.0"
VF_PYTHON = VENV / "bin" / "python"
API_KEY_VAR = "VFBENCH_API_KEY"


_venv_checked = False


def ensure_venv() -> Path:
    """Create the verifiers virtualenv (outside the repo) on first use; returns its python.
    Probed once per process (the probe imports verifiers: seconds on a loaded machine)."""
    global _venv_checked
    if _venv_checked:
        return VF_PYTHON
    if VF_PYTHON.exists():
        probe = [str(VF_PYTHON), "-c", "import verifiers.v1"]
        if subprocess.run(probe, capture_output=True).returncode == 0:
            _venv_checked = True
            return VF_PYTHON
    print(f"creating {VENV} with verifiers=={VF_VERSION} (one-off)", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    pip = [str(VF_PYTHON), "-m", "pip", "install", "-q", f"verifiers=={VF_VERSION}", "psutil"]
    subprocess.run(pip, check=True)
    _venv_checked = True
    return VF_PYTHON


def versions() -> dict[str, str]:
    """Versions of both frameworks and of the interpreter, for the README."""
    code = "import verifiers, sys; print(verifiers.__version__)"
    vf = subprocess.run([str(ensure_venv()), "-c", code], capture_output=True, text=True)
    from importlib.metadata import version

    return {
        "python": sys.version.split()[0],
        "vfray": version("vfray"),
        "ray": version("ray"),
        "verifiers": vf.stdout.strip(),
    }


@contextlib.contextmanager
def scripted_model(latency: float, policy: str = "arithmetic") -> Iterator[str]:
    """``vfray serve-model`` in its own process (so neither side's CPU time pays for it);
    yields the OpenAI base URL both frameworks use."""
    argv = [sys.executable, "-m", "vfray.cli.serve_model", "--policy", policy]
    argv += ["--port", "0", "--latency", str(latency)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        yield line.rsplit(" ", 1)[-1].strip()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def tree_rss(root: psutil.Process) -> int:
    """Resident memory of ``root`` and all its descendants, in bytes."""
    total = 0
    with contextlib.suppress(psutil.Error):
        for proc in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                total += proc.memory_info().rss
    return total


@dataclass
class Measured:
    """One measured command: when it was launched, how long it ran, its peak tree RSS."""

    launched: float
    wall: float
    peak_rss: int
    returncode: int
    out_dir: Path
    stderr_tail: str = ""
    samples: list[tuple[float, int]] = field(default_factory=list)


def run_measured(argv: list[str], env: dict[str, str], out_dir: Path, timeout: float) -> Measured:
    """Run ``argv`` to completion, sampling the RSS of its whole process tree every 0.25 s."""
    log = tempfile.TemporaryFile()  # noqa: SIM115 - read back after the process ends
    launched = time.time()
    start = time.perf_counter()
    proc = subprocess.Popen(
        argv, env=env, stdout=subprocess.DEVNULL, stderr=log, cwd=out_dir, start_new_session=True
    )
    root = psutil.Process(proc.pid)
    samples: list[tuple[float, int]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append((time.perf_counter() - start, tree_rss(root)))
            stop.wait(0.25)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        # The whole session (Ray workers, harness programs) goes, not only the CLI process.
        os.killpg(proc.pid, signal.SIGKILL)
        code = proc.wait()
    wall = time.perf_counter() - start
    stop.set()
    sampler.join()
    log.seek(0)
    tail = log.read().decode(errors="replace")[-3000:]
    peak = max((rss for _, rss in samples), default=0)
    return Measured(launched, wall, peak, code, out_dir, tail, samples)


def fresh_dir(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=f"vfbench-{prefix}-"))


# -- the eval commands ------------------------------------------------------------------------

SIDES = ("vfray", "vfray-local", "verifiers")
"""What the comparison scripts measure: ``vfray eval --backend ray`` ("vfray", the default,
kept under its old name so older results.json entries still read), ``vfray eval --backend
local`` ("vfray-local": one process, no Ray) and verifiers' ``vf-eval``."""
VFRAY_SIDES = ("vfray", "vfray-local")
BACKEND = {"vfray": "ray", "vfray-local": "local"}
LABEL = {"vfray": "vfray (Ray)", "vfray-local": "vfray (local)", "verifiers": "verifiers"}


def ratio_key(name: str, side: str) -> str:
    """Where a vfray side's ratio against verifiers is stored: ``ratio_<name>`` for the Ray
    backend (the name older results use), ``ratio_<name>_local`` for the local one."""
    return f"ratio_{name}" if side == "vfray" else f"ratio_{name}_local"


def vfray_eval(
    url: str,
    tasks: int,
    rollouts: int,
    concurrency: int,
    timeout: float,
    backend: str = "ray",
) -> Measured:
    out = fresh_dir(f"vfray-{backend}")
    argv = [sys.executable, "-m", "vfray.cli.main", "eval", "arithmetic"]
    # The built-in taskset holds 100 tasks by default; size it like the verifiers side.
    argv += ["--taskset-args", json.dumps({"num_tasks": tasks})]
    argv += ["-n", str(tasks), "-r", str(rollouts), "-c", str(concurrency), "-m", "scripted"]
    argv += ["--base-url", url, "--harness", "null", "--runtime", "subprocess"]
    argv += ["--backend", backend, "--no-progress", "-o", str(out / "outputs")]
    return run_measured(argv, {**os.environ}, out, timeout)


def verifiers_eval(
    url: str, tasks: int, rollouts: int, concurrency: int, timeout: float
) -> Measured:
    out = fresh_dir("verifiers")
    argv = [str(ensure_venv().parent / "vf-eval"), "vfbench-arith", "-m", "scripted"]
    argv += ["--client.base-url", url, "--client.api-key-var", API_KEY_VAR]
    argv += ["--env.agent.harness.id", "null", "--env.agent.runtime.type", "subprocess"]
    argv += ["--env.taskset.num-tasks", str(tasks), "-n", str(tasks), "-r", str(rollouts)]
    argv += ["-c", str(concurrency), "--no-push", "--no-rich", "-o", str(out / "outputs")]
    env = {**os.environ, "PYTHONPATH": str(VF_SIDE), API_KEY_VAR: "unused"}
    env.pop("VIRTUAL_ENV", None)
    return run_measured(argv, env, out, timeout)


def run_side(
    side: str, url: str, tasks: int, rollouts: int, concurrency: int, timeout: float
) -> tuple[Measured, Finished]:
    """Run one side's eval command and read back what it finished."""
    if side == "verifiers":
        measured = verifiers_eval(url, tasks, rollouts, concurrency, timeout)
        return measured, verifiers_finished(measured.out_dir)
    measured = vfray_eval(url, tasks, rollouts, concurrency, timeout, BACKEND[side])
    return measured, vfray_finished(measured.out_dir)


def sides_arg(parser: argparse.ArgumentParser) -> None:
    """The ``--sides`` option every comparison script takes (default: all three)."""
    parser.add_argument(
        "--sides",
        nargs="+",
        choices=SIDES,
        default=list(SIDES),
        help="what to measure: vfray (Ray backend), vfray-local (local backend), verifiers",
    )


def ordered(sides: Iterable[str]) -> list[str]:
    """``sides`` in the canonical order, without repeats."""
    chosen = set(sides)
    return [side for side in SIDES if side in chosen]


@dataclass
class Finished:
    """What a run wrote: how many rollouts finished ok, and when each finished (epoch s)."""

    ok: int
    total: int
    ends: list[float]
    trace_files: list[Path]
    first_start: float | None = None
    """When the earliest rollout started (epoch s): the end of the command's start-up."""


def vfray_finished(out_dir: Path) -> Finished:
    import pyarrow.parquet as pq

    files = sorted(out_dir.glob("outputs/*/*/traces/*.parquet"))
    if not files:
        return Finished(0, 0, [], [])
    table = pq.read_table(files[0].parent, columns=["ok", "started_at", "ended_at"])
    rows = table.to_pylist()
    ends = sorted(_epoch(r["ended_at"]) for r in rows if r["ended_at"] is not None)
    starts = [_epoch(r["started_at"]) for r in rows if r["started_at"] is not None]
    ok = sum(1 for r in rows if r["ok"])
    return Finished(ok, len(rows), ends, files, min(starts, default=None))


def verifiers_finished(out_dir: Path) -> Finished:
    files = sorted(out_dir.glob("outputs/*/traces.jsonl"))
    ok = total = 0
    ends: list[float] = []
    starts: list[float] = []
    for path in files:
        for line in path.read_text().splitlines():
            episode = json.loads(line)
            for trace in episode.get("traces", []):
                total += 1
                ok += bool(trace.get("ok"))
                timing = trace.get("timing", {})
                end = (timing.get("scoring") or {}).get("end")
                if end is not None:
                    ends.append(float(end))
                if timing.get("start") is not None:
                    starts.append(float(timing["start"]))
    return Finished(ok, total, sorted(ends), files, min(starts, default=None))


def _epoch(value: Any) -> float:
    return value.timestamp() if hasattr(value, "timestamp") else float(value)


def cleanup(measured: Measured) -> None:
    shutil.rmtree(measured.out_dir, ignore_errors=True)


def gib(n: float) -> float:
    return n / 2**30


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def memory_budget_gib() -> float:
    """How much memory one measured run may take: 60% of what is free now (the machine is
    shared, and an out-of-memory kill would take other people's processes with it)."""
    return 0.6 * gib(psutil.virtual_memory().available)


def load_summary() -> str:
    """The machine and its load right now, for the README."""
    mem = psutil.virtual_memory()
    load = os.getloadavg()
    return (
        f"{os.cpu_count()} CPUs, {gib(mem.total):.0f} GiB RAM ({gib(mem.available):.0f} GiB free), "
        f"load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}"
    )
