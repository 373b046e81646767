"""The legacy bridge (vfray/compat/v1/_legacy.py): classic verifiers environments, a
``SingleTurnEnv`` (a sync reward with the rubric's parser, an async one, a weight-0 metric), a
``ToolEnv`` (a python-function tool) and a ``MultiTurnEnv`` (its ``env_response`` asks a
follow-up), from tests/v1_tasksets/legacy_envs.py, scored by verifiers' own ``run_rollout`` and by
``vfray eval`` against the same scripted model server, in one process of the side-by-side
virtualenv (``VFRAY_V1_VENV``) with verifiers' classic stack (0.3.1; 0.4.0 ships v1 alone) on
its path (``VFRAY_V1_CLASSIC``; .ci/run installs both). Skipped without them.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
SIDE = ROOT / "benchmarks" / "vs_verifiers" / "legacy_side.py"
ENVS = Path(__file__).parent / "v1_tasksets"
CASES = [["single", "arithmetic", 3], ["tools", "agent", 2], ["multi", "arithmetic", 2]]
CASES += [["group", "refused", 0], ["envgroup", "refused", 0], ["single", "thread", 0]]
CASES += [["single", "refused", 0, "--env.agent.harness.id", "null"], ["single", "slow", 1]]


def _paths() -> tuple[Path, Path]:
    venv = os.environ.get("VFRAY_V1_VENV", "")
    classic = os.environ.get("VFRAY_V1_CLASSIC", f"{venv}-classic")
    if not venv or not (Path(venv) / "bin" / "python").exists():
        pytest.skip("no virtualenv with vfray and verifiers (VFRAY_V1_VENV; .ci/run)")
    if not (Path(classic) / "verifiers" / "legacy").is_dir():
        pytest.skip("no classic verifiers stack (VFRAY_V1_CLASSIC; .ci/run)")
    return Path(venv), Path(classic)


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    venv, classic = _paths()
    tmp = tmp_path_factory.mktemp("legacy")
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    env.update(PYTHONPATH=os.pathsep.join([str(classic), str(ENVS)]), HF_DATASETS_OFFLINE="1")
    done = subprocess.run(
        [str(venv / "bin" / "python"), str(SIDE), str(tmp), "legacy-envs", json.dumps(CASES)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp,
        timeout=600,
    )
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    # vfray's side ran verifiers' own classes: the classic stack on the path, no shim.
    assert out["verifiers"].startswith(str(classic)), out["verifiers"]
    return out


# verifiers names its stop after the condition that ended its loop; vfray's trace says the
# harness completed (a difference listed in docs/guides/v1.md).
STOPS = {"max_turns_reached", "no_tools_called"}


def _compare(case: dict[str, Any]) -> list[dict[str, Any]]:
    theirs = sorted(case["theirs"], key=lambda r: r["key"])
    ours = sorted(case["ours"], key=lambda r: r["key"])
    assert len(theirs) == len(ours) > 0
    assert {r["stop_condition"] for r in theirs} <= STOPS
    assert {r["stop_condition"] for r in ours} == {"agent_completed"}
    for theirs_row, ours_row in zip(theirs, ours, strict=True):
        # vfray keeps verifiers' stop as a note on its own trace
        note = f"verifiers' stop condition: {theirs_row['stop_condition']}"
        assert ours_row.pop("trace")["notes"] == [note]
    for row in (*theirs, *ours):
        row.pop("stop_condition")
    assert ours == theirs  # keys, rewards, every function's score, transcripts, errors
    return theirs


@pytest.mark.slow
def test_single_turn_env_scores_the_same(result: dict[str, Any]) -> None:
    rows = _compare(result["cases"]["single"])
    # The sync reward with the parser (the scripted model gets 10 - 4 wrong on purpose: the
    # row says 7), the async one weighted 0.25, the weight-0 metric, verifiers' num_turns.
    assert [r["scores"]["correct"] for r in rows] == [1.0, 1.0, 0.0]
    assert [r["reward"] for r in rows] == [1.125, 1 + 0.25 / 3, 0.125]
    assert all(r["scores"]["num_turns"] == 1.0 and r["scores"]["tool_result"] == 0 for r in rows)
    assert [m["role"] for m in rows[0]["messages"]] == ["system", "user", "assistant"]


@pytest.mark.slow
def test_tool_env_runs_its_python_tools_and_scores_the_same(result: dict[str, Any]) -> None:
    calls = {r["key"]: r["trace"]["tool_calls"] for r in result["cases"]["tools"]["ours"]}
    rows = _compare(result["cases"]["tools"])
    # On vfray's trace too, as a vfray tool call: server, name, arguments, result.
    assert calls == {
        "0": [["legacy", "add", {"a": 2, "b": 3}, "5"]],
        "1": [["legacy", "add", {"a": 20, "b": 22}, "42"]],
    }
    assert [r["reward"] for r in rows] == [2.0, 2.0]
    assert all(r["scores"]["add_calls"] == 1.0 for r in rows)
    roles = [m["role"] for m in rows[0]["messages"]]
    assert roles == ["user", "assistant", "tool", "assistant"]
    assert rows[0]["messages"][1]["tool_calls"] == [{"name": "add", "arguments": {"a": 2, "b": 3}}]


@pytest.mark.slow
def test_multi_turn_env_response_loop_scores_the_same(result: dict[str, Any]) -> None:
    rows = _compare(result["cases"]["multi"])
    assert [r["reward"] for r in rows] == [1.0, 1.0]
    assert [m["content"] for m in rows[0]["messages"][2:]] == ["5", "What is 5 + 1?", "6"]


@pytest.mark.slow
def test_group_rewards_and_env_groups_are_refused_in_one_line(result: dict[str, Any]) -> None:
    said = result["cases"]["group"]
    assert said["rc"] == 2, said
    assert said["stderr"][-1:] == [
        "vfray: error: classic env 'legacy_envs': group reward functions are not supported "
        "by vfray's legacy bridge: best_of_group"
    ], said
    said = result["cases"]["envgroup"]
    assert said["rc"] == 2, said
    assert said["stderr"][-1:] == [
        "vfray: error: classic env 'legacy_envs': an EnvGroup is not supported by vfray's legacy "
        "bridge (its rows route to sub-envs, each with its own rubric): run each env on its own"
    ], said
    said = result["cases"]["single --env.agent.harness.id null"]
    assert said["rc"] == 2, said
    assert said["stderr"][-1:] == [
        "vfray: error: classic env 'legacy-envs': not supported by vfray's legacy bridge: "
        "--env.agent.harness.id"
    ], said


@pytest.mark.slow
def test_without_the_classic_stack_the_cause_is_one_line(tmp_path: Path) -> None:
    # verifiers 0.4.0 alone (the venv without VFRAY_V1_CLASSIC): the package's own
    # `class FollowUp(vf.MultiTurnEnv)` fails its import; the line says why.
    venv, _ = _paths()
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    env["PYTHONPATH"] = str(ENVS)
    argv = ["eval", "legacy-envs", "-n", "1", "-m", "scripted", "--no-push", "--no-rich"]
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "vfray.cli.main", *argv, "-o", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1] == (
        "vfray: error: v1 taskset 'legacy-envs': importing 'legacy_envs' failed: "
        "AttributeError: module 'verifiers' has no attribute 'MultiTurnEnv' (verifiers' classic "
        "stack is not installed here: verifiers 0.4.0 ships v1 alone; 0.3.1 has SingleTurnEnv, "
        "ToolEnv, ...)"
    )


@pytest.mark.slow
def test_an_env_built_off_the_main_thread_as_on_ray(result: dict[str, Any]) -> None:
    # verifiers' Environment installs signal handlers when built, which only the main thread
    # may do; a Ray actor builds it on its loop's thread ("signal only works in main thread").
    assert result["cases"]["single@thread"] == "SingleTurnEnv"


@pytest.mark.slow
def test_a_loop_past_the_agents_time_leaves_an_error_that_says_so(result: dict[str, Any]) -> None:
    # The model takes 3 s, the agent 0.5 s: verifiers' loop is cancelled with its state.
    said = "verifiers' rollout loop did not finish (the agent's time ran out): its rubric has "
    said += "no state to score"
    assert sorted(result["cases"]["single@slow"]) == [
        f"TaskError: reward {name} raised: TaskError: {said}" for name in ("brevity", "correct")
    ]
