"""The ``kimi-code`` harness: Kimi Code (npm ``@moonshot-ai/kimi-code``) installed into the node's
tool dir, one scored rollout against the scripted ``agent`` model through the interception in
bwrap and in docker, and a refused call that ends the program. Skipped with the reason when npm
(or the engine) is unavailable.
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
from vfray.harnesses.kimi_code import KimiCodeConfig, KimiCodeHarness, mcp_json
from vfray.interception import Limits
from vfray.rollout import Timeouts


def test_kimi_code_is_registered_with_a_typed_config() -> None:
    assert "kimi-code" in available_harnesses()
    kimi = make_harness("kimi-code", {"version": "2.0.2"})
    assert isinstance(kimi, KimiCodeHarness) and isinstance(kimi.config, KimiCodeConfig)
    assert kimi.tool_spec().requirement == "@moonshot-ai/kimi-code@2.0.2"
    assert kimi.EXECUTES_CODE and not kimi.NEEDS_CONTAINER
    with pytest.raises(ConfigError, match="kimi-code"):
        make_harness("kimi-code", {"no_such_option": 1})


def test_kimi_code_mcp_json_names_the_tasks_servers() -> None:
    config = json.loads(mcp_json({"pad": "http://127.0.0.1:9/mcp/t"}))
    assert config == {"mcpServers": {"pad": {"url": "http://127.0.0.1:9/mcp/t"}}}


def _check_events(trace: vf.Trace) -> None:
    (artifact,) = trace.artifacts
    events = [json.loads(line) for line in artifact.content.splitlines() if line.strip()]
    commands = [
        json.loads(call["function"]["arguments"])["command"]
        for e in events
        if e.get("role") == "assistant"
        for call in e.get("tool_calls") or []
    ]
    assert commands == ["printf '%s\\n' 'hello agent' > out.txt", "cat out.txt"]
    assert events[-1]["type"] == "session.resume_hint"  # written once the prompt is done


@pytest.mark.slow
@pytest.mark.bwrap
async def test_kimi_code_rollout_in_bwrap(tmp_path: Path) -> None:
    """Also with a skill: its SKILL.md, installed into the agent's own skills folder, is
    offered to the model in the first request."""
    need_registry("npm")
    _timed_install("kimi-code")
    skills = {"skills": [str(make_skill(tmp_path))]}
    trace = await _rollout("kimi-code", runtime="bwrap", harness_options=skills)
    assert DESCRIPTION in _request_text(trace)
    # write, cat, final answer: three chat-completions calls.
    _check_solved(trace, calls=3)
    _check_events(trace)


@pytest.mark.slow
@pytest.mark.docker
async def test_kimi_code_rollout_in_docker(docker_url: str) -> None:
    need_registry("npm")
    _timed_install("kimi-code")
    trace = await _rollout(
        "kimi-code", runtime="docker", runtime_options=runtime_options(docker_url)
    )
    _check_solved(trace, calls=3)
    _check_events(trace)


@pytest.mark.slow
@pytest.mark.bwrap
async def test_kimi_code_calls_the_scratchpad_over_mcp() -> None:
    """Kimi Code connects to the servers of the mcp.json in its home and offers their tools as
    ``mcp__SERVER__TOOL``; the scripted model calls them by name."""
    need_registry("npm")
    _timed_install("kimi-code")
    task = ScratchpadTaskset().load()[3]
    trace = await vf.run_rollout(task, model="scripted:agent", harness="kimi-code", runtime="bwrap")
    assert trace.errors == [], trace.errors
    assert [c.name for c in trace.tool_calls] == ["write_note", "read_note"]
    assert trace.rewards["remembered"].value == 1.0
    offered = {t.get("function", t).get("name") for t in trace.calls[0].tools or []}
    assert {"mcp__scratchpad__write_note", "mcp__scratchpad__read_note"} <= offered


@pytest.mark.slow
@pytest.mark.bwrap
async def test_a_refused_call_ends_kimi_code() -> None:
    """After the interception refuses a call (max_turns=1) Kimi Code is ended, not left
    retrying: the rollout ends by its limit, before the agent budget."""
    need_registry("npm")
    _timed_install("kimi-code")
    trace = await _rollout(
        "kimi-code", runtime="bwrap", limits=Limits(max_turns=1), timeouts=Timeouts(agent=90)
    )
    check_ended_after_refusal(trace, "kimi-code")
