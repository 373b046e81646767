"""The ``qwen-code`` harness: Qwen Code (npm) installed into the node's tool dir, one scored
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
from vfray.harnesses.qwen_code import QwenCodeConfig, settings
from vfray.interception import Limits
from vfray.rollout import Timeouts


def test_qwen_code_is_registered_with_a_typed_config() -> None:
    assert "qwen-code" in available_harnesses()
    qwen = make_harness("qwen-code", {"disabled_tools": ["web_fetch"]})
    assert isinstance(qwen.config, QwenCodeConfig) and qwen.config.disabled_tools == ("web_fetch",)
    assert qwen.EXECUTES_CODE and not qwen.NEEDS_CONTAINER and qwen.SUPPORTS_MCP
    with pytest.raises(ConfigError, match="qwen-code"):
        make_harness("qwen-code", {"no_such_option": 1})


def test_qwen_code_settings_turn_off_everything_but_the_interception() -> None:
    found = settings({"notes": "http://127.0.0.1:9/mcp"})
    assert found["privacy"] == {"usageStatisticsEnabled": False}
    assert found["telemetry"] == {"enabled": False}
    assert found["general"] == {"enableAutoUpdate": False}
    assert found["security"] == {"auth": {"selectedType": "openai"}}
    assert found["mcpServers"] == {"notes": {"httpUrl": "http://127.0.0.1:9/mcp"}}
    # MCP tools offered directly, not behind its tool_search tool.
    assert found["tools"] == {"useRipgrep": False, "toolSearch": {"enabled": False}}
    assert "mcpServers" not in settings() and settings()["tools"] == {"useRipgrep": False}


def _check_events(trace: vf.Trace) -> None:
    (artifact,) = trace.artifacts
    events = [json.loads(line) for line in artifact.content.splitlines() if line.strip()]
    assert events[-1]["type"] == "result" and events[-1]["subtype"] == "success"
    commands = [
        part["input"]["command"]
        for e in events
        if e["type"] == "assistant"
        for part in e["message"]["content"]
        if part["type"] == "tool_use"
    ]
    assert commands == ["printf '%s\\n' 'hello agent' > out.txt", "cat out.txt"]


@pytest.mark.slow
@pytest.mark.bwrap
async def test_qwen_code_rollout_in_bwrap(tmp_path: Path) -> None:
    """Also with a skill: its SKILL.md, installed into the agent's own skills folder, is
    offered to the model in the first request."""
    need_registry("npm")
    _timed_install("qwen-code")
    skills = {"skills": [str(make_skill(tmp_path))]}
    trace = await _rollout("qwen-code", runtime="bwrap", harness_options=skills)
    assert DESCRIPTION in _request_text(trace)
    # write, cat, final answer: three chat-completions calls offering run_shell_command.
    _check_solved(trace, calls=3)
    _check_events(trace)


@pytest.mark.slow
@pytest.mark.docker
async def test_qwen_code_rollout_in_docker(docker_url: str) -> None:
    need_registry("npm")
    _timed_install("qwen-code")
    trace = await _rollout(
        "qwen-code", runtime="docker", runtime_options=runtime_options(docker_url)
    )
    _check_solved(trace, calls=3)
    _check_events(trace)


@pytest.mark.slow
@pytest.mark.bwrap
async def test_a_refused_call_ends_qwen_code() -> None:
    """After the interception refuses a call (max_turns=1) Qwen Code is ended, not left
    retrying: the rollout ends by its limit, before the agent budget."""
    need_registry("npm")
    _timed_install("qwen-code")
    trace = await _rollout(
        "qwen-code", runtime="bwrap", limits=Limits(max_turns=1), timeouts=Timeouts(agent=90)
    )
    check_ended_after_refusal(trace, "qwen-code")


@pytest.mark.slow
async def test_qwen_code_calls_the_scratchpad_over_mcp() -> None:
    """The task's MCP server, named in its config, is offered to the model and called."""
    need_registry("npm")
    _timed_install("qwen-code")
    task = ScratchpadTaskset().load()[3]
    trace = await vf.run_rollout(task, model="scripted:agent", harness="qwen-code")
    assert trace.errors == [], trace.errors
    assert [c.name for c in trace.tool_calls] == ["write_note", "read_note"]
    assert trace.tool_calls[1].result == "water plants"
    assert trace.rewards["remembered"].value == 1.0
