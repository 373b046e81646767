"""``vfray export RUN_DIR --format v1`` as a user runs it (``python -m vfray`` in a subprocess),
on a run of the v1 package tests/v1_tasksets/v1cmp by the scripted model: the file it writes is
v1's on-disk ``traces.jsonl`` (v1's Episode / Trace layout, line by line), read back the way v1
tooling reads a run folder (verifiers 0.4.0's own ``read_episodes``) with the run's scores."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from agent_tools import need_registry

import vfray as vf
from vfray.compat import v1
from vfray.compat.v1 import loader
from vfray.compat.v1.traces import read_v1_traces
from vfray.models.scripted.server import scripted_server
from vfray.runtimes.provision import ToolSpec, ensure_tool

V1CMP = str(Path(__file__).parent / "v1_tasksets" / "v1cmp")
ROOT = Path(vf.__file__).resolve().parents[1]

# v1 0.4.0's Episode and Trace fields (verifiers/v1/episode.py, trace.py) that v1 tooling reads.
EPISODE_FIELDS = {"id", "env", "task", "ok", "errors", "traces"}
TRACE_FIELDS = {
    "version",
    "id",
    "task",
    "agent",
    "nodes",
    "calls",
    "rewards",
    "metrics",
    "is_completed",
    "ok",
    "stop_condition",
    "errors",
    "timing",
}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    v1.install()
    taskset = loader.load(V1CMP, {"kinds": ["plain", "stop_request", "stop_response"]})
    with (
        scripted_server("arithmetic") as url,
        vf.Farm(
            model="scripted",
            base_url=url,
            harness="null",
            backend="local",
            progress=False,
            output_dir=str(tmp_path_factory.mktemp("out")),
        ) as farm,
    ):
        result = farm.run(taskset)
    return Path(result.run_dir)


def _vfray(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [sys.executable, "-m", "vfray", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_export_cli_writes_v1s_traces_jsonl(run_dir: Path, tmp_path: Path) -> None:
    done = _vfray("export", str(run_dir), "--format", "v1")
    assert done.returncode == 0, done.stderr[-2000:]
    written = run_dir / "v1" / "traces.jsonl"
    assert done.stdout.strip() == f"wrote {written}"
    lines = [json.loads(line) for line in written.read_text().splitlines()]
    assert len(lines) == 4  # one v1 episode per rollout
    for episode in lines:
        assert set(episode) == EPISODE_FIELDS
        [trace] = episode["traces"]
        assert set(trace) >= TRACE_FIELDS and trace["version"] == 1
        assert episode["task"] == trace["task"] and episode["env"] == {"id": "v1cmp"}
        assert set(trace["task"]) == {"type", "data", "key", "hash"}
        assert trace["task"]["type"] == "CmpTask" and trace["task"]["data"]["kind"]
        for node in trace["nodes"]:
            assert set(node) <= {"message", "parent", "sampled"}
            assert node.get("parent", -1) < trace["nodes"].index(node)
        for reward in trace["rewards"].values():
            assert set(reward) == {"score", "weight"}
        assert {c["node"] for c in trace["calls"]} <= set(range(len(trace["nodes"]))) | {None}
    # -o writes elsewhere; the two files are the same export.
    other = tmp_path / "elsewhere.jsonl"
    assert _vfray("export", str(run_dir), "--format", "v1", "-o", str(other)).returncode == 0
    assert read_v1_traces(other) == read_v1_traces(written)


def test_the_export_cli_refuses_a_folder_that_is_not_a_run(tmp_path: Path) -> None:
    done = _vfray("export", str(tmp_path), "--format", "v1")
    assert done.returncode == 2 and done.stdout == ""
    line = done.stderr.strip()
    assert "\n" not in line and f"{tmp_path} is not a run folder" in line


def test_verifiers_own_reader_reads_the_export_with_the_runs_scores(run_dir: Path) -> None:
    need_registry("pypi")
    spec = ToolSpec(name="verifiers", kind="pypi", package="verifiers", version="0.4.0")
    python = ensure_tool(spec).executable("python")
    assert _vfray("export", str(run_dir), "--format", "v1").returncode == 0
    # v1's read_episodes(results_dir, trace_type): what vf-replay and v1's tooling load a run by.
    read = (
        "import sys, json\n"
        "from pathlib import Path\n"
        "import verifiers.v1 as vf\n"
        "from verifiers.v1.utils.trace_store import read_episodes\n"
        "rows = []\n"
        "for e in read_episodes(Path(sys.argv[1]), vf.WireTrace):\n"
        "    for t in e.traces:\n"
        "        rows.append([t.task.key, t.reward, t.stop_condition, t.metrics,"
        " {k: r.score for k, r in t.rewards.items() if r is not None},"
        " t.last_reply, t.num_turns])\n"
        "print(json.dumps(sorted(rows, key=json.dumps)))"
    )
    done = subprocess.run(
        [python, "-c", read, str(run_dir / "v1")],
        env={k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    theirs = json.loads(done.stdout)
    ours: list[list[Any]] = sorted(
        (
            [o.key, o.reward, o.stop_condition, o.metrics, o.rewards, o.reply, o.metrics["turns"]]
            for o in read_v1_traces(run_dir / "v1" / "traces.jsonl")
        ),
        key=json.dumps,
    )
    assert theirs == ours
    assert sorted(row[2] for row in theirs) == [
        "agent_completed",
        "agent_completed",
        "halt_request",
        "seven_reply",
    ]
