"""The ``hermes-agent`` harness: Hermes Agent from PyPI in the node's tool dir, driven by the
scripted ``agent`` model through the interception, in a bwrap box and in a docker container;
a refused call ends it. Skipped with the reason when PyPI (or the box) is not there."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from agent_tools import check_ended_after_refusal, need_registry
from docker_engine import runtime_options
from test_agent_skills import DESCRIPTION, SeesSkill, _request_text, make_skill
from test_agents import PROMPT, WriteFile, _check_solved, _timed_install

import vfray as vf
from examples.tools_scratchpad import ScratchpadTaskset
from vfray.harnesses import make_harness
from vfray.harnesses.hermes_agent import (
    HermesAgentConfig,
    HermesAgentHarness,
    config_yaml,
    update_check,
)
from vfray.interception import Limits
from vfray.rollout import Timeouts

HARNESS = "hermes-agent"


def test_the_config_names_the_interception_and_leaves_nothing_to_look_up() -> None:
    harness = make_harness(HARNESS, {"toolsets": ["terminal"], "context_length": 4096})
    assert isinstance(harness, HermesAgentHarness) and harness.EXECUTES_CODE
    assert isinstance(harness.config, HermesAgentConfig)
    config = json.loads(config_yaml("m", "http://127.0.0.1:9/v1", "sk-x", harness.config))
    assert config["model"] == {
        "provider": "custom",
        "base_url": "http://127.0.0.1:9/v1",
        "api_key": "sk-x",
        "default": "m",
        "context_length": 4096,
    }
    cached = json.loads(update_check("0.19.0"))
    assert cached["ver"] == "0.19.0" and cached["behind"] == 0
    assert abs(cached["ts"] - time.time()) < 60
    argv = harness.argv("hermes", "do it", "m")
    assert argv[argv.index("-t") + 1] == "terminal" and "--yolo" in argv
    assert "mcp_servers" not in config and harness.SUPPORTS_MCP
    servers = {"notes": "http://127.0.0.1:9/mcp"}
    config = json.loads(config_yaml("m", "http://127.0.0.1:9/v1", "k", harness.config, servers))
    assert config["mcp_servers"] == {"notes": {"url": "http://127.0.0.1:9/mcp"}}
    assert config["mcp_discovery_timeout"] == 60.0
    # A server's tools are its own toolset, under its name, offered beside the options' ones.
    argv = harness.argv("hermes", "do it", "m", ("notes",))
    assert argv[argv.index("-t") + 1] == "terminal,notes"


async def _rollout(runtime: str, **options: object) -> vf.Trace:
    need_registry("pypi")
    _timed_install(HARNESS)
    data = vf.TaskData(prompt=PROMPT, workdir="/box" if runtime == "bwrap" else None)
    return await vf.run_rollout(
        WriteFile(data), model="scripted:agent", harness=HARNESS, runtime=runtime, **options
    )


def _check_hermes_solved(trace: vf.Trace) -> None:
    # write, cat, final answer: three model calls, each offering Hermes's terminal tool.
    _check_solved(trace, calls=3)
    assert all("terminal" in [t["function"]["name"] for t in c.tools or []] for c in trace.calls)
    (artifact,) = trace.artifacts
    assert artifact.name == "hermes-output.txt" and "hello agent" in artifact.content


@pytest.mark.slow
@pytest.mark.bwrap
async def test_hermes_agent_rollout_in_bwrap() -> None:
    """The tool dir is bound read-only; the box has no network but the interception's bridge,
    so a start that reached out (pypi.org, openrouter.ai, github.com) would stall or fail."""
    _check_hermes_solved(await _rollout("bwrap"))


@pytest.mark.slow
@pytest.mark.docker
async def test_hermes_agent_rollout_in_docker(docker_url: str) -> None:
    _check_hermes_solved(await _rollout("docker", runtime_options=runtime_options(docker_url)))


@pytest.mark.slow
@pytest.mark.bwrap
async def test_a_refused_call_ends_hermes_agent() -> None:
    """After the interception refuses the second call (max_turns=1) Hermes is ended within the
    stop grace, not left retrying for the agent budget."""
    trace = await _rollout("bwrap", limits=Limits(max_turns=1), timeouts=Timeouts(agent=90))
    check_ended_after_refusal(trace, HARNESS)


@pytest.mark.slow
async def test_hermes_agent_calls_the_scratchpad_over_mcp() -> None:
    """The task's MCP server, named in Hermes's config, is offered to the model (as
    ``mcp__scratchpad__NAME``) and called."""
    need_registry("pypi")
    _timed_install(HARNESS)
    task = ScratchpadTaskset().load()[3]
    trace = await vf.run_rollout(task, model="scripted:agent", harness=HARNESS)
    assert trace.errors == [], trace.errors
    assert [c.name for c in trace.tool_calls] == ["write_note", "read_note"]
    assert trace.tool_calls[1].result == "water plants"
    assert trace.rewards["remembered"].value == 1.0


@pytest.mark.slow
async def test_hermes_agent_lists_a_skill_from_its_home(tmp_path: Path) -> None:
    """A skills folder goes into ``$HERMES_HOME/skills`` with its executable bits, and Hermes
    (given its ``skills`` toolset) lists the skill, with its description, to the model."""
    need_registry("pypi")
    _timed_install(HARNESS)
    skill = str(make_skill(tmp_path))
    harness = make_harness(HARNESS, {"skills": [skill]})
    assert isinstance(harness, HermesAgentHarness)
    argv = harness.argv("hermes", "do it", "m")
    assert argv[argv.index("-t") + 1] == "terminal,file,skills"
    task = SeesSkill(vf.TaskData(prompt='Write "ok" to done.txt'))
    task.skills_dir = HermesAgentHarness.SKILLS_DIR or ""
    trace = await vf.run_rollout(
        task, model="scripted:agent", harness=HARNESS, harness_options={"skills": [skill]}
    )
    assert trace.errors == [], trace.errors
    assert trace.metrics["installed"] == 1.0
    # Hermes's skill index cuts a description at 60 characters.
    assert f"vowel-counter: {DESCRIPTION[:40]}" in _request_text(trace)
