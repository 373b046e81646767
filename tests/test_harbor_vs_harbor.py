"""The same 10 Harbor tasks (benchmarks/vs_harbor/tasks, built FROM the offline Debian base) run
by Harbor 0.26.0 itself (PyPI, in a Python 3.12 virtualenv of its own; ``harbor run`` on its
docker environment) and by ``vfray eval harbor:PATH`` on docker, with the ``oracle`` (all 10
tasks) and with Claude Code against the scripted ``agent`` model (the 4 tasks of
:data:`AGENT_TASKS`): the rewards must be the same, task by task, every named value of
``reward.json`` included. Two of the tasks' plans are wrong on purpose (0.0 and 0.5 for the
agent), so agreement is not all ones.

Harbor's codex and claude-code agents would install themselves from the internet; offline they
find the native codex and claude binaries already in the tasks' base image and skip their
install (see
benchmarks/vs_harbor/common.py). Both pairs run at the same time (Harbor's runs in
subprocesses, vfray's one after the other in this process). Skipped without Python 3.12+,
without an engine or the base image, and when Harbor's venv is not cached and PyPI is
unreachable.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from agent_tools import need_registry

from benchmarks.vs_harbor import common
from vfray.cli.main import main
from vfray.models.scripted.server import scripted_server
from vfray.run.results import final_rows
from vfray.runtimes.provision import InstalledTool, find_tool
from vfray.traces.convert import table_to_traces
from vfray.traces.io import read_traces

pytestmark = pytest.mark.slow
AGENT_REWARDS = {"wrong-plan": 0.0, "partial-credit": 0.5}
"""The agent's scores where its plan is wrong; 1.0 on the others."""
AGENT_TASKS = ("wrong-plan", "partial-credit", "json-report", "python-bug")
"""The tasks Claude Code runs on both sides: its two wrong plans, reward.json's named values and
one it solves. The oracle pair covers all 10; a real agent on the other six cost each CI run ~75
CPU-s (Harbor's ~5 CPU-s a trial, the agent's own on both sides) and showed nothing new
(benchmarks/vs_harbor runs every task with every agent)."""


@pytest.fixture(scope="module")
def harbor() -> InstalledTool:
    python = common.find_python312()
    if python is None:
        pytest.skip("Harbor needs Python >= 3.12 and this machine has none")
    if find_tool(common.harbor_spec(python)) is None:
        need_registry("pypi")  # ~60 s once per machine; found in the tools root after
    return common.ensure_harbor()


@pytest.fixture(scope="module")
def engine(docker_url: str, debian_in_docker: str) -> str:
    try:
        common.codex_binary()
        common.claude_binary()
    except Exception:  # not provisioned yet: they come from npm
        need_registry("npm")
    common.build_bench_image(docker_url)
    return docker_url


def _vfray_rewards(out: Path) -> dict[str, dict[str, float]]:
    [run] = out.glob("*/*")
    traces = table_to_traces(final_rows(read_traces(run / "traces")))
    found: dict[str, dict[str, float]] = {}
    for trace in traces:
        assert trace.errors == [], (trace.task.key, trace.errors)
        found[trace.task.key] = {
            k: r.value for k, r in trace.rewards.items() if r.value is not None
        }
    return found


CONCURRENT = 10
"""Trials at once on each side: all 10 tasks in one wave. A Harbor trial is mostly waiting on
docker (build, up, exec, down: ~28 s of wall for ~3 s of CPU here), so Harbor's oracle run took
77 s in waves of 4 and 54 s in one wave of 10, for the same CPU (33 vs 35 s)."""

# Codex also agrees (benchmarks/vs_harbor runs all of common.AGENTS); the suite keeps one real
# agent, the faster one: the codex pair cost CI 105 s of its 20-minute budget.
PAIRED = ("oracle", "claude-code")


@dataclass(frozen=True)
class Pair:
    """One agent's run on each side: how Harbor's ended (and its output), vfray's exit status,
    the folder holding both (``harbor/``, ``vfray/``) and the tasks' folder both ran."""

    harbor_code: int
    harbor_output: str
    vfray_code: int
    folder: Path
    tasks: Path


@pytest.fixture(scope="module")
def pairs(
    harbor: InstalledTool, engine: str, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Pair]:
    """Every agent of :data:`PAIRED` on both sides, all at the same time: Harbor's runs in
    subprocesses, vfray's one after the other in this process (a run's signal handlers and run
    log are the process's). The two Harbor runs wait on docker side by side."""
    options = json.dumps({"base_url": engine, "build_network": "host"})
    config = common.docker_config(harbor)
    root = tmp_path_factory.mktemp("pairs")
    tasks = {agent: _task_folder(root, agent) for agent in PAIRED}
    theirs: dict[str, subprocess.Popen[bytes]] = {}
    with scripted_server("agent") as url, contextlib.ExitStack() as stack:
        for agent in PAIRED:
            argv = common.harbor_run_argv(
                harbor, tasks[agent], agent, root / agent / "harbor", concurrent=CONCURRENT,
                base_url=None if agent == "oracle" else url,
            )  # fmt: skip
            log = stack.enter_context((root / f"{agent}.log").open("wb"))
            proc = subprocess.Popen(
                argv, env=common.harbor_env(harbor, engine, config), stdout=log, stderr=log
            )
            stack.callback(_stop, proc)
            theirs[agent] = proc
        ours = {}
        for agent in PAIRED:
            model = "scripted:echo" if agent == "oracle" else "scripted:agent"
            ours[agent] = main(
                [
                    "eval", f"harbor:{tasks[agent]}", "--harness", agent, "-m", model,
                    "--runtime", "docker", "--env.runtime.options", options,
                    "-o", str(root / agent / "vfray"), "--backend", "local", "-r", "1",
                    "-c", str(CONCURRENT), "--no-progress",
                ]
            )  # fmt: skip
        for proc in theirs.values():
            proc.wait(timeout=900)
    return {
        agent: Pair(
            proc.returncode,
            (root / f"{agent}.log").read_text(errors="replace"),
            ours[agent],
            root / agent,
            tasks[agent],
        )
        for agent, proc in theirs.items()
    }


def _task_folder(root: Path, agent: str) -> Path:
    """The folder of tasks ``agent`` runs on both sides: every task for the oracle, a copy of
    :data:`AGENT_TASKS` alone for an agent."""
    if agent == "oracle":
        return common.TASKS
    folder = root / f"{agent}-tasks"
    for name in AGENT_TASKS:
        shutil.copytree(common.TASKS / name, folder / name)
    return folder


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("agent", PAIRED)
def test_harbor_and_vfray_score_the_same(pairs: dict[str, Pair], agent: str) -> None:
    pair = pairs[agent]
    assert pair.harbor_code == 0, pair.harbor_output[-3000:]
    assert pair.vfray_code == 0
    theirs = common.harbor_rewards(pair.folder / "harbor")
    ours = _vfray_rewards(pair.folder / "vfray")
    names = {p.name for p in pair.tasks.iterdir() if (p / "task.toml").is_file()}
    assert len(names) == (10 if agent == "oracle" else len(AGENT_TASKS))
    assert set(theirs) == set(ours) == names
    for name in sorted(names):
        [harbor_rewards] = theirs[name]  # one trial each
        assert harbor_rewards == ours[name], name
    expected = {n: 1.0 if agent == "oracle" else AGENT_REWARDS.get(n, 1.0) for n in names}
    assert {n: r["reward"] for n, r in ours.items()} == expected
    # reward.json's named values are rewards of their own on both sides.
    assert set(ours["json-report"]) == {"reward", "parsed", "status", "count"}


LOAD_WITH_HARBOR = """
import json, pathlib, sys
from harbor.models.job.config import JobConfig
from harbor.models.job.result import JobResult
from harbor.models.trial.config import TrialConfig
from harbor.models.trial.result import TrialResult
job = pathlib.Path(sys.argv[1])
JobConfig.model_validate_json((job / "config.json").read_text())
result = JobResult.model_validate_json((job / "result.json").read_text())
trials = {}
for folder in sorted(p for p in job.iterdir() if p.is_dir()):
    TrialConfig.model_validate_json((folder / "config.json").read_text())
    trial = TrialResult.model_validate_json((folder / "result.json").read_text())
    files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    trials[trial.task_name] = [trial.verifier_result.rewards, trial.agent_info.name, files]
print(json.dumps({"n": result.n_total_trials, "evals": list(result.stats.evals), "trials": trials}))
"""


def test_harbor_reads_a_vfray_run_exported_as_a_job(
    harbor: InstalledTool, engine: str, tmp_path: Path
) -> None:
    """``vfray export --format harbor``: Harbor's own result models load the job and its
    trials (in Harbor's venv), with the rewards vfray scored."""
    options = json.dumps({"base_url": engine, "build_network": "host"})
    argv = ["eval", f"harbor:{common.TASKS}", "--harness", "oracle", "-m", "scripted:echo"]
    argv += ["--runtime", "docker", "--env.runtime.options", options, "-o", str(tmp_path / "out")]
    assert main([*argv, "--backend", "local", "-r", "1", "-n", "3", "--no-progress"]) == 0
    [run] = (tmp_path / "out").glob("*/*")
    assert main(["export", str(run), "--format", "harbor", "-o", str(tmp_path / "jobs")]) == 0
    [job] = (tmp_path / "jobs").iterdir()
    done = subprocess.run(
        [harbor.executable("python"), "-c", LOAD_WITH_HARBOR, str(job)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = json.loads(done.stdout)
    assert loaded["n"] == 3 and loaded["evals"] == ["oracle__scripted:echo__vfray"]
    ours = _vfray_rewards(tmp_path / "out")
    assert {name: t[0] for name, t in loaded["trials"].items()} == {
        name: ours[name] for name in loaded["trials"]
    }
    for _, agent, files in loaded["trials"].values():
        assert agent == "oracle"
        assert "verifier/reward.json" in files and "agent/oracle.txt" in files
