"""The ``opencode`` harness: opencode (npm) installed into the node's tool dir, one scored
rollout against the scripted ``agent`` model through the interception in bwrap and in docker,
a task's MCP tools and a skill offered, and a refused call that ends the program. Skipped with
the reason when npm (or the engine) is unavailable.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from agent_tools import check_ended_after_refusal, need_registry
from docker_engine import runtime_options
from test_agent_skills import DESCRIPTION, _request_text, make_skill
from test_agents import _check_solved, _rollout, _timed_install

import vfray as vf
from examples.tools_scratchpad import ScratchpadTaskset
from vfray.errors import ConfigError
from vfray.harnesses import available_harnesses, make_harness
from vfray.harnesses.opencode import OpencodeConfig, config_json
from vfray.interception import Limits
from vfray.rollout import Timeouts


def test_opencode_is_registered_with_a_typed_config() -> None:
    assert "opencode" in available_harnesses()
    qwen = make_harness("opencode", {"disabled_tools": ["webfetch"]})
    assert isinstance(qwen.config, OpencodeConfig) and qwen.config.disabled_tools == ("webfetch",)
    assert qwen.EXECUTES_CODE and not qwen.NEEDS_CONTAINER and qwen.SUPPORTS_MCP
    with pytest.raises(ConfigError, match="opencode"):
        make_harness("opencode", {"no_such_option": 1})


def test_opencode_config_names_the_interception_as_its_only_provider() -> None:
    config = config_json(
        "scripted:agent", "http://127.0.0.1:9/v1", {"notes": "http://127.0.0.1:9/mcp"}, ("task",), 7
    )
    assert config["model"] == "vfray/scripted:agent"
    assert config["autoupdate"] is False and config["share"] == "disabled"
    assert config["provider"] == {
        "vfray": {
            "npm": "@ai-sdk/openai-compatible",
            "name": "vfray",
            "options": {"baseURL": "http://127.0.0.1:9/v1", "apiKey": "{env:VFRAY_API_KEY}"},
            "models": {"scripted:agent": {"name": "scripted:agent", "tool_call": True}},
        }
    }
    assert config["mcp"] == {
        "notes": {"type": "remote", "url": "http://127.0.0.1:9/mcp", "enabled": True}
    }
    assert config["tools"] == {"task": False}
    assert config["agent"] == {"build": {"steps": 7}}


def _check_events(trace: vf.Trace) -> None:
    (artifact,) = trace.artifacts
    events = [json.loads(line) for line in artifact.content.splitlines() if line.strip()]
    assert events[-1]["type"] == "step_finish" and events[-1]["part"]["reason"] == "stop"
    commands = [
        e["part"]["state"]["input"]["command"]
        for e in events
        if e["type"] == "tool_use" and e["part"]["tool"] == "bash"
    ]
    assert commands == ["printf '%s\\n' 'hello agent' > out.txt", "cat out.txt"]


@pytest.mark.slow
@pytest.mark.bwrap
async def test_opencode_rollout_in_bwrap(tmp_path: Path) -> None:
    """Also with a skill: its SKILL.md, installed into the agent's own skills folder, is
    offered to the model in the first request."""
    need_registry("npm")
    _timed_install("opencode")
    skills = {"skills": [str(make_skill(tmp_path))]}
    trace = await _rollout("opencode", runtime="bwrap", harness_options=skills)
    assert DESCRIPTION in _request_text(trace)
    # write, cat, final answer: three chat-completions calls offering its bash tool.
    _check_solved(trace, calls=3)
    _check_events(trace)


@pytest.mark.slow
@pytest.mark.docker
async def test_opencode_rollout_in_docker(docker_url: str) -> None:
    need_registry("npm")
    _timed_install("opencode")
    trace = await _rollout(
        "opencode", runtime="docker", runtime_options=runtime_options(docker_url)
    )
    _check_solved(trace, calls=3)
    _check_events(trace)


@pytest.mark.slow
@pytest.mark.bwrap
async def test_a_refused_call_ends_opencode() -> None:
    """After the interception refuses a call (max_turns=1) opencode is ended, not left
    retrying: the rollout ends by its limit, before the agent budget."""
    need_registry("npm")
    _timed_install("opencode")
    trace = await _rollout(
        "opencode", runtime="bwrap", limits=Limits(max_turns=1), timeouts=Timeouts(agent=90)
    )
    check_ended_after_refusal(trace, "opencode")


@pytest.mark.slow
async def test_opencode_calls_the_scratchpad_over_mcp() -> None:
    """The task's MCP server, named in its config, is offered to the model and called."""
    need_registry("npm")
    _timed_install("opencode")
    task = ScratchpadTaskset().load()[3]
    trace = await vf.run_rollout(task, model="scripted:agent", harness="opencode")
    assert trace.errors == [], trace.errors
    assert [c.name for c in trace.tool_calls] == ["write_note", "read_note"]
    assert trace.tool_calls[1].result == "water plants"
    assert trace.rewards["remembered"].value == 1.0
