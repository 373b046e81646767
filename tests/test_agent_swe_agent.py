"""The ``swe-agent`` harness: SWE-agent 1.x provisioned from a source the user names (it is not on
PyPI), run as ``sweagent run`` with its SWE-ReX deployment local to the box, driven by the
scripted ``agent`` model through its ``bash_only`` config (a thought and one fenced bash block
per step, then ``submit``) via the interception, on a task of ``examples/bash_file_task.py``.

The rollouts need a SWE-agent source with no network: ``VFRAY_SWE_AGENT_SOURCE`` names one (a
source tree, an archive of one, or a ``git+`` URL the node can clone); without it they are
skipped with that reason. The refusals run always."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import openai
import pytest
from agent_tools import check_ended_after_refusal, need_registry
from docker_engine import runtime_options

import vfray as vf
from vfray._plugins import load_object
from vfray.harnesses import make_harness
from vfray.harnesses.swe_agent import SweAgentConfig, SweAgentHarness
from vfray.interception import Limits
from vfray.models.scripted.agent import SWE_AGENT_SUBMIT
from vfray.models.scripted.server import ScriptedModel, scripted_server
from vfray.rollout import Timeouts

HARNESS = "swe-agent"
SOURCE_ENV = "VFRAY_SWE_AGENT_SOURCE"
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "bash_file_task.py"


def test_the_harness_is_built_in_and_refuses_a_missing_source_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VFRAY_TOOLS_DIR", str(tmp_path / "tools"))
    harness = make_harness(HARNESS, {"source": str(tmp_path / "nowhere"), "max_steps": 7})
    assert isinstance(harness, SweAgentHarness) and isinstance(harness.config, SweAgentConfig)
    with pytest.raises(vf.ConfigError) as missing:
        harness.preflight("bwrap")
    assert "\n" not in str(missing.value) and "not on PyPI" in str(missing.value)
    with pytest.raises(vf.ConfigError, match="cannot run from the wheel"):
        make_harness(HARNESS, {"source": "sweagent-1.1.0-py3-none-any.whl"}).preflight("bwrap")
    # A git source the node cannot reach: the clone's own reason, in one line, at setup.
    unreachable = make_harness(HARNESS, {"source": f"git+file://{tmp_path}/no-repo@v1.1.0"})
    with pytest.raises(vf.HarnessError) as failed:
        asyncio.run(unreachable.installed())  # type: ignore[attr-defined]
    assert "\n" not in str(failed.value), failed.value
    assert "cannot fetch SWE-agent from git+file://" in str(failed.value), failed.value
    argv = harness.argv("/t/venv/bin/sweagent", "/t/src", "m", "http://127.0.0.1:9/v1")
    assert argv[:4] == ["/t/venv/bin/sweagent", "run", "--config", "/t/src/config/bash_only.yaml"]
    assert "--env.deployment.type=local" in argv and "--env.repo.reset=false" in argv
    assert "--agent.model.per_instance_call_limit=7" in argv
    assert not any("secret" in a for a in argv)  # the key is read from the env


def test_the_agent_policy_ends_swe_agents_plan_with_submit() -> None:
    """SWE-agent's ``bash_only`` prompt shows ``submit`` as a bash block: the scripted ``agent``
    model answers each step as one fenced bash block (observations come back as user turns)
    and ends with ``submit`` instead of a text answer SWE-agent would reject."""
    system = f"Reply with one bash block.\nWhen done:\n{SWE_AGENT_SUBMIT}\n"
    messages: list[Any] = [
        {"role": "system", "content": system},
        {"role": "user", "content": 'Write "hello" to greeting.txt.'},
    ]
    with scripted_server(ScriptedModel("agent")) as url:
        client = openai.OpenAI(base_url=url, api_key="k")
        blocks = []
        for _ in range(3):
            reply = client.chat.completions.create(model="m", messages=messages)
            text = reply.choices[0].message.content or ""
            blocks.append(text.split("```bash\n", 1)[1].split("\n```", 1)[0])
            messages += [
                {"role": "assistant", "content": text},
                {"role": "user", "content": "<observation>\nok\n</observation>"},
            ]
    assert blocks == ["printf '%s\\n' hello > greeting.txt", "cat greeting.txt", "submit"]


needs_source = pytest.mark.skipif(
    not os.environ.get(SOURCE_ENV),
    reason=f"no SWE-agent source: it is not on PyPI; set {SOURCE_ENV} to its source tree, an "
    "archive of it or a git+URL the node can clone",
)  # a mark, not a skip in the test: the docker test's engine is then never started for nothing


def _source() -> str:
    need_registry("pypi")  # its dependencies (swe-rex, litellm...) come from PyPI
    return os.environ[SOURCE_ENV]


async def _rollout(runtime: str, **options: Any) -> vf.Trace:
    source = _source()
    tasks = load_object(f"{EXAMPLE}:BashFileTaskset")()
    task = next(t for t in tasks if t.key == "greeting.txt")
    async with vf.LocalEnvironment(
        "scripted:agent",
        harness=HARNESS,
        harness_options={"source": source},
        runtime=runtime,
        **options,
    ) as env:
        trace: vf.Trace = await env.rollout(task)
    return trace


def _check_solved(trace: vf.Trace) -> None:
    assert trace.errors == [], trace.errors
    assert trace.stop_condition is vf.StopCondition.COMPLETED
    assert trace.rewards["file_written"].value == 1.0
    # write, cat, then SWE-agent's submit: three calls, all answered.
    assert len(trace.calls) == 3, [c.error for c in trace.calls]
    assert all(c.error is None for c in trace.calls)
    names = {a.name for a in trace.artifacts}
    assert {"swe-agent.log", "vfray.traj"} <= names, names


@pytest.mark.slow
@pytest.mark.bwrap
@needs_source
async def test_swe_agent_scores_bash_file_task_in_bwrap() -> None:
    _check_solved(await _rollout("bwrap"))


@pytest.mark.slow
@pytest.mark.docker
@needs_source
async def test_swe_agent_scores_bash_file_task_in_docker(docker_url: str) -> None:
    """SWE-agent checks each tool with ``which``; the test image's ``/usr`` is the host's, whose
    ``which`` is a Debian alternative, so the host's alternatives are mounted too (a real
    image has its own)."""
    options = runtime_options(docker_url)
    options["volumes"] = {**options["volumes"], "/etc/alternatives": "/etc/alternatives"}  # type: ignore[dict-item]
    _check_solved(await _rollout("docker", runtime_options=options))


class Anything(vf.Task[vf.TaskData]):
    """Any outcome scores: the stop test's task."""

    @vf.reward
    async def ran(self) -> bool:
        return True


@pytest.mark.slow
@pytest.mark.bwrap
@needs_source
async def test_a_refused_call_ends_swe_agent() -> None:
    """The interception refuses the second call (max_turns=1): the program is stopped (SIGTERM,
    then the stop grace) rather than left retrying."""
    source = _source()
    data = vf.TaskData(prompt="run: echo one\nrun: echo two")
    trace = await vf.run_rollout(
        Anything(data),
        model="scripted:agent",
        harness=HARNESS,
        harness_options={"source": source},
        runtime="bwrap",
        limits=Limits(max_turns=1),
        timeouts=Timeouts(agent=120),
    )
    check_ended_after_refusal(trace, HARNESS)
