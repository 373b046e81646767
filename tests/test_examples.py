"""The example tasksets in ``examples/`` end to end in this process, with the scripted model.

They are loaded by file path, the way ``vfray eval examples/x.py:Class`` loads them.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

import vfray as vf
from vfray._plugins import load_object
from vfray.tasksets.arithmetic import make_task

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
HAS_BWRAP = shutil.which("bwrap") is not None
HAS_UV = shutil.which("uv") is not None
LOCAL = [
    "subprocess",
    pytest.param("bwrap", marks=pytest.mark.skipif(not HAS_BWRAP, reason="no bwrap")),
]


def taskset(spec: str, **kwargs: Any) -> vf.Taskset[Any]:
    cls = load_object(f"{EXAMPLES / spec}")
    made = cls(**kwargs)
    assert isinstance(made, vf.Taskset)
    return made


async def run_all(tasks: vf.Taskset[Any], model: str, harness: str, runtime: str) -> list[vf.Trace]:
    async with vf.LocalEnvironment(model, harness=harness, runtime=runtime) as env:
        return list(await asyncio.gather(*(env.rollout(task) for task in tasks)))


@pytest.mark.parametrize("runtime", LOCAL)
async def test_bash_file_task_is_checked_inside_the_box(runtime: str) -> None:
    tasks = taskset("bash_file_task.py:BashFileTaskset")
    traces = await run_all(tasks, "scripted:bash", "bash", runtime)
    assert len(traces) == 5
    for trace in traces:
        assert trace.ok, trace.errors
        assert trace.rewards["file_written"].value == 1.0
        assert trace.metrics["tool_turns"] == 1


@pytest.mark.skipif(not (HAS_BWRAP and HAS_UV), reason="needs bwrap and uv")
async def test_bash_file_task_scores_with_a_real_agent_program() -> None:
    # The same prompts drive the real agents through the scripted ``agent`` policy: mini-swe-agent
    # (the quickest to start) stands for them; docs/agents/index.md lists the run of every agent.
    tasks = taskset("bash_file_task.py:BashFileTaskset")
    picked = [t for t in tasks if t.key in ("greeting.txt", "todo.txt")]
    traces = await run_all(picked, "scripted:agent", "mini-swe-agent", "bwrap")
    assert [t.reward for t in traces] == [1.0, 1.0], [t.errors for t in traces]


async def test_bash_file_task_fails_when_no_file_is_written() -> None:
    # The echo model repeats the prompt and never calls the bash tool: no file, no reward.
    tasks = taskset("bash_file_task.py:BashFileTaskset").head(2)
    traces = await run_all(tasks, "scripted:echo", "bash", "subprocess")
    assert [t.reward for t in traces] == [0.0, 0.0]
    assert all(t.ok and t.metrics["tool_turns"] == 0 for t in traces)


@pytest.mark.skipif(not HAS_UV, reason="uv is not installed (pip install uv)")
@pytest.mark.parametrize("runtime", LOCAL)
async def test_gsm8k_style_checker_runs_in_the_box(runtime: str) -> None:
    tasks = taskset("gsm8k_style.py:Gsm8kStyleTaskset")
    traces = await run_all(tasks, "scripted:arithmetic", "null", runtime)
    assert len(traces) == 5
    for trace in traces:
        assert trace.ok, trace.errors
        assert trace.rewards["correct"].value == 1.0, trace.rewards


@pytest.mark.skipif(not HAS_UV, reason="uv is not installed (pip install uv)")
async def test_gsm8k_style_wrong_answers_score_zero() -> None:
    # accuracy=0: the scripted model is always off by 1..9.
    tasks = taskset("gsm8k_style.py:Gsm8kStyleTaskset").head(2)
    traces = await run_all(tasks, "scripted:arithmetic?accuracy=0", "null", "subprocess")
    assert [t.reward for t in traces] == [0.0, 0.0]


async def test_gsm8k_style_without_uv_records_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A box whose PATH has a Python (for the harness) and nothing else, so no uv.
    (tmp_path / "python3").symlink_to(sys.executable)
    monkeypatch.setenv("PATH", str(tmp_path))
    task = next(iter(taskset("gsm8k_style.py:Gsm8kStyleTaskset")))
    trace = await vf.run_rollout(
        task, model="scripted:arithmetic", harness="null", runtime="subprocess"
    )
    # The rollout ran to the end; its reward hook raised: an error in scoring, not a silent None.
    assert trace.stop_condition is vf.StopCondition.COMPLETED
    assert [e.phase for e in trace.errors] == ["scoring"]
    assert "uv is not installed in the box" in trace.errors[0].message
    record = trace.rewards["correct"]
    assert record.value is None and trace.reward is None
    assert record.error is not None and "uv is not installed in the box" in record.error
    assert any("uv is not installed" in note for note in trace.notes)
    assert os.environ["PATH"] == str(tmp_path)


async def test_builtin_arithmetic_episode_has_group_reward() -> None:
    episode = await vf.run_episode(
        make_task(12, 30), n=4, model="scripted:arithmetic", harness="null", runtime="subprocess"
    )
    assert episode.group_rewards == {"brevity_rank": [1.0, 1.0, 1.0, 1.0]}
    assert episode.rewards == [1.1, 1.1, 1.1, 1.1]
    assert all(t.last_reply == "42" for t in episode.traces)
