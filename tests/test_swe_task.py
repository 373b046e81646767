"""The SWE-style example task (examples/swe_task/) end to end: a git repository with a failing
unittest is baked into the task's image (a Dockerfile FROM the offline Debian base), a real
coding agent (mini-swe-agent, codex, claude-code) driven by the scripted ``agent`` policy fixes
the bug in ``/testbed``, and the reward runs the repository's tests in the box. The tests import
a module that only the image's own site-packages hold, so a reward of 1.0 means the image's
``python3`` ran them. On docker and bwrap, on the local backend (each agent) and the Ray
backend (one agent per runtime). Skipped with the reason where a registry, the engine or the
base image is missing."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from agent_tools import need_registry

import vfray as vf
from vfray._plugins import load_object
from vfray.config import EvalConfig
from vfray.harnesses import make_harness
from vfray.harnesses.provisioned import ProvisionedHarness
from vfray.runtimes.provision import ensure_tool

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "swe_task" / "swe_task.py"
REGISTRY = {"mini-swe-agent": "pypi", "codex": "npm", "claude-code": "npm"}
AGENTS = ["codex", "claude-code", pytest.param("mini-swe-agent", marks=pytest.mark.slow)]
"""mini-swe-agent is the slowest (litellm's import: 18 s a rollout on docker here, 30 s on
bwrap, against 2-5 s for the others)."""

BWRAP_MARKS = [
    pytest.mark.bwrap,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="no bwrap"),
]


def _tasks() -> vf.Taskset[Any]:
    made = load_object(f"{EXAMPLE}:SweTaskset")()
    assert isinstance(made, vf.Taskset)
    return made


def _provision(harness_id: str) -> None:
    """The agent's program in the node's tool dir (kept between runs), outside any rollout."""
    if harness_id not in REGISTRY:
        return
    need_registry(REGISTRY[harness_id])
    harness = make_harness(harness_id)
    assert isinstance(harness, ProvisionedHarness)
    ensure_tool(harness.tool_spec(), harness.tools_root)


def _run(
    harness: str, runtime: str, backend: str, docker_url: str, tmp_path: Path
) -> dict[str, Any]:
    """One rollout of the task on ``runtime``, through a Farm on ``backend``; its trace row.
    Both runtimes get the image from the tests' engine (bwrap unpacks what it built)."""
    _provision(harness)
    config = EvalConfig()
    option = "base_url" if runtime == "docker" else "docker_url"
    config.env.runtime.options = {option: docker_url}
    with vf.Farm(
        "scripted:agent",
        config=config,
        harness=harness,
        runtime=runtime,
        backend=backend,
        max_retries=0,
        output_dir=str(tmp_path / "runs"),
        progress=False,
    ) as farm:
        result = farm.run(_tasks(), rollouts_per_task=1)
    (row,) = result.final_traces.to_pylist()
    return row


def _metric(row: dict[str, Any], name: str) -> float | None:
    return {m["key"]: m["value"] for m in row["metrics"]}.get(name)


def _check_solved(row: dict[str, Any]) -> None:
    assert row["error_type"] is None, row["error_message"]
    assert row["stop_condition"] == "completed"
    assert row["reward"] == 1.0
    assert _metric(row, "files_changed") == 1.0  # stats.py, committed in the image


@pytest.fixture
def base(debian_in_docker: str, docker_url: str) -> str:
    """The tests' engine, holding the offline base image the task's Dockerfile starts FROM."""
    return docker_url


def test_the_unfixed_repository_scores_zero(base: str, tmp_path: Path) -> None:
    # The null harness only chats: the bug stays, the image's tests fail, the reward is 0.
    row = _run("null", "docker", "local", base, tmp_path)
    assert row["error_type"] is None, row["error_message"]
    assert row["reward"] == 0.0 and _metric(row, "files_changed") == 0.0


RUNTIMES = ["docker", pytest.param("bwrap", marks=BWRAP_MARKS)]


@pytest.mark.parametrize("harness", AGENTS)
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_local(runtime: str, harness: str, base: str, tmp_path: Path) -> None:
    _check_solved(_run(harness, runtime, "local", base, tmp_path))


@pytest.mark.usefixtures("ray_local")
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_ray(runtime: str, base: str, tmp_path: Path) -> None:
    _check_solved(_run("codex", runtime, "ray", base, tmp_path))
