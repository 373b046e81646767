"""What tests/test_chaos.py reads to tell whether a fault hit and what it did: the driver's own
log of retried attempts, the run folder as the faulted run left it (before any resume), and
what the run's boxes hold on this machine (work dirs, cgroups, containers)."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import vfray as vf
from vfray.runtimes import _reap

Attempt = tuple[str, int, int]
"""(the task key's first 12 characters, rollout index, attempt), as the driver logs it."""

LOST = re.compile(r"rollout (\S{1,12})/(\d+) attempt (\d+) lost \(")
FAILED = re.compile(r"rollout (\S{1,12})/(\d+) attempt (\d+) failed with (\w+); retrying")
RESENT = re.compile(r"the TraceSink died \(.*?\); re-sending (\d+) appends")
RESUMED = re.compile(r"vfray resume \S+: (\d+) rollouts to run")

RETRIED_TYPES = {"InfrastructureError", "InterceptionError", "ProviderError"}
"""The error types the driver retries (its ``RETRYABLE`` and ``ProviderError``)."""


def logged(run_dir: Path) -> dict[str, Any]:
    """What the driver logged to ``<run_dir>/eval.log``: the attempts it retried after a lost
    host and after a model failure (by error type), and the appends it re-sent to a restarted
    TraceSink."""
    try:
        text = (run_dir / "eval.log").read_text(errors="replace")
    except OSError:
        text = ""
    failed: dict[str, set[Attempt]] = {}
    for m in FAILED.finditer(text):
        failed.setdefault(m[4], set()).add((m[1], int(m[2]), int(m[3])))
    return {
        "lost": {(m[1], int(m[2]), int(m[3])) for m in LOST.finditer(text)},
        "failed": failed,
        "resent": [int(m[1]) for m in RESENT.finditer(text)],
        "resumed": [int(m[1]) for m in RESUMED.finditer(text)],
        "text": text,
    }


def rows(run_dir: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every trace row (every attempt) and every episode row on disk; ([], []) while a part
    is being written."""
    try:
        result = vf.RunResult(run_dir)
        # Episodes first: the sink writes a group's episode row after its trace rows, so every
        # episode read here has its traces on disk when they are read next. Read the other way
        # round, a group written in between shows its episode row over no trace rows.
        episodes = result.episodes.select(["task_key", "n", "num_ok"]).to_pylist()
        traces = result.traces.select(
            ["task_key", "rollout_index", "attempt", "ok", "error_type", "error_message"]
        ).to_pylist()
    except Exception:  # a folder with no parts yet, or a part half written
        return [], []
    return traces, episodes


def on_disk(traces: Iterable[dict[str, Any]], error_type: str) -> set[Attempt]:
    return {
        (r["task_key"][:12], r["rollout_index"], r["attempt"])
        for r in traces
        if r["error_type"] == error_type
    }


def folder_problems(run_dir: Path, n: int, running: bool = False) -> list[str]:
    """What is wrong with a run folder a faulted run left, before any resume. Rows reach the
    folder a group at a time (a task's final rows with its episode row) or an attempt at a
    time (an attempt the driver retried), so: no attempt twice; every task with an episode
    row has exactly its ``n`` rollouts, each ending in an ok attempt after only retried
    attempts of the faults' types; no ok row without its episode row (a retried attempt
    whose retry had not ended when the driver died is the only row of a task without one).
    ``running``: the run still writes, and a group's trace rows may be on disk before its
    episode row (written after them), so that last check is left out."""
    traces, episodes = rows(run_dir)
    problems: list[str] = []
    seen = [(r["task_key"], r["rollout_index"], r["attempt"]) for r in traces]
    if len(seen) != len(set(seen)):
        problems.append("a rollout attempt was written twice")
    grouped = {e["task_key"] for e in episodes}
    if len(grouped) != len(episodes):
        problems.append("a task has two episode rows")
    by_rollout: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in traces:
        by_rollout.setdefault((r["task_key"], r["rollout_index"]), []).append(r)
    for e in episodes:
        indices = {i for (k, i) in by_rollout if k == e["task_key"]}
        if indices != set(range(n)) or e["n"] != n:
            problems.append(f"task {e['task_key']}: episode of n={e['n']} over rows {indices}")
    for (key, index), attempts in sorted(by_rollout.items()):
        attempts.sort(key=lambda r: r["attempt"])
        *earlier, last = attempts
        for r in earlier:
            if r["ok"] or r["error_type"] not in RETRIED_TYPES:
                problems.append(
                    f"{key}/{index} attempt {r['attempt']} was retried after "
                    f"{r['error_type'] or 'success'}: {r['error_message']}"
                )
        if key in grouped and not last["ok"]:
            problems.append(
                f"{key}/{index} ended with {last['error_type']}: {last['error_message']}"
            )
        if not running and key not in grouped and any(r["ok"] for r in attempts):
            problems.append(f"{key}/{index} has an ok row and its task no episode row")
    return problems


def box_dirs(temp: Path) -> set[str]:
    """The boxes' work dirs under the run's temp dir (``vfray-<kind>-<owner>-…``)."""
    return {p.name for p in temp.glob("vfray-*") if _reap.DIR_NAME.match(p.name)}


def box_cgroups(owners: Iterable[str]) -> set[str]:
    """The cgroups of those owners' boxes (``vfray-<owner>-<box id>`` in each controller)."""
    found: set[str] = set()
    for owner in owners:
        for path in Path(_reap.CGROUP_ROOT).glob(f"*/vfray-{owner}-*"):
            found.add(str(path))
    return found


def owners_of(dirs: Iterable[str]) -> set[str]:
    return {m[1] for d in dirs if (m := _reap.DIR_NAME.match(d))}


def gone(pid: int) -> bool:
    """The process is gone (or a zombie, dead but not yet waited for)."""
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] == "Z"
    return True


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
            name = cmd[:120].decode(errors="replace").rstrip()
            found.append(f"{entry}: {name} ({_facts(entry, env)})")
    return found


def watchdogs() -> dict[str, list[int]]:
    """The live watchdogs, by the first 8 characters of the owner token each watches: with
    :func:`marked`'s owner tokens, a failure says whether a leftover's owner still had one."""
    return {token[:8]: pids for token, pids in _reap.env_pids(_reap.WATCHDOG_ENV).items()}


def _facts(pid: str, env: bytes) -> str:
    """What a process that outlived its owner was doing: its state, parent, kernel wait channel
    and whether it carries an owner token (what the watchdogs kill by), for a failure's message."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
        wchan = Path(f"/proc/{pid}/wchan").read_text()
    except OSError:
        return "gone"
    fields = stat[stat.rfind(b")") + 2 :].split()
    owner = [v for v in env.split(b"\0") if v.startswith(f"{_reap.OWNER_ENV}=".encode())]
    token = owner[0].split(b"=", 1)[1][:8].decode() if owner else "none"
    return f"state {fields[0].decode()}, ppid {fields[1].decode()}, wchan {wchan}, owner {token}"
