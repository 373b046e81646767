"""The ``openclaw`` harness: OpenClaw (npm ``openclaw``, 836 MiB with its Node.js 24) installed
into the node's tool dir, one scored rollout against the scripted ``agent`` model through the
interception in bwrap and in docker, and a refused call that ends the program. Skipped with the
reason when npm (or the engine) is unavailable.
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
from vfray.harnesses.openclaw import OpenClawConfig, OpenClawHarness, openclaw_config
from vfray.interception import Limits
from vfray.rollout import Timeouts


def test_openclaw_is_registered_with_a_typed_config() -> None:
    assert "openclaw" in available_harnesses()
    oc = make_harness("openclaw", {"version": "2026.9.5"})
    assert isinstance(oc, OpenClawHarness) and isinstance(oc.config, OpenClawConfig)
    assert oc.tool_spec().requirement == "openclaw@2026.9.5"
    assert oc.tool_spec().packages == ("node@24",)
    assert oc.EXECUTES_CODE and not oc.NEEDS_CONTAINER
    with pytest.raises(ConfigError, match="openclaw"):
        make_harness("openclaw", {"no_such_option": 1})


def test_openclaw_config_names_the_interception_and_the_tasks_servers() -> None:
    plain = json.loads(openclaw_config("scripted:agent", "http://127.0.0.1:9/v1", ("browser",)))
    provider = plain["models"]["providers"]["vfray"]
    assert (
        provider["baseUrl"] == "http://127.0.0.1:9/v1" and provider["apiKey"] == "${VFRAY_API_KEY}"
    )
    assert plain["agents"]["defaults"]["model"] == {"primary": "vfray/scripted:agent"}
    assert plain["tools"] == {"profile": "coding", "deny": ["browser"]}
    assert plain["update"] == {"checkOnStart": False} and plain["mcp"] == {"servers": {}}
    pad = {"pad": "http://127.0.0.1:9/mcp/t"}
    tools = json.loads(openclaw_config("m", "http://x/v1", mcp_servers=pad))
    assert tools["mcp"]["servers"]["pad"] == {"url": pad["pad"], "transport": "streamable-http"}
    assert tools["tools"]["toolSearch"] is False and "skills" not in tools
    skills = json.loads(openclaw_config("m", "http://x/v1", skills=True))["skills"]
    assert skills == {"load": {"extraDirs": ["${VFRAY_SKILLS_DIR}"]}}


def _check_result(trace: vf.Trace) -> None:
    (artifact,) = trace.artifacts
    result = json.loads(artifact.content)
    assert result["ok"] and result["status"] == "ok", result
    assert (result["provider"], result["model"]) == ("vfray", "scripted:agent")
    # write and cat through its shell tool, then the answer: three turns.
    assert result["toolSummary"]["tools"] == ["exec"] and result["toolSummary"]["calls"] == 2
    assert result["assistantTurns"] == 3


@pytest.mark.slow
@pytest.mark.bwrap
async def test_openclaw_rollout_in_bwrap(tmp_path: Path) -> None:
    """Also with a skill: its SKILL.md, installed into the folder its config names, is offered
    to the model in the first request."""
    need_registry("npm")
    _timed_install("openclaw")
    skills = {"skills": [str(make_skill(tmp_path))]}
    trace = await _rollout("openclaw", runtime="bwrap", harness_options=skills)
    assert DESCRIPTION in _request_text(trace)
    # write, cat, final answer: three chat-completions calls.
    _check_solved(trace, calls=3)
    _check_result(trace)


@pytest.mark.slow
@pytest.mark.docker
async def test_openclaw_rollout_in_docker(docker_url: str) -> None:
    need_registry("npm")
    _timed_install("openclaw")
    trace = await _rollout(
        "openclaw", runtime="docker", runtime_options=runtime_options(docker_url)
    )
    _check_solved(trace, calls=3)
    _check_result(trace)


@pytest.mark.slow
@pytest.mark.bwrap
async def test_openclaw_calls_the_scratchpad_over_mcp() -> None:
    """OpenClaw connects to the servers its config names and declares their tools as
    ``SERVER__TOOL``; the scripted model calls them by name."""
    need_registry("npm")
    _timed_install("openclaw")
    task = ScratchpadTaskset().load()[3]
    trace = await vf.run_rollout(task, model="scripted:agent", harness="openclaw", runtime="bwrap")
    assert trace.errors == [], trace.errors
    assert [c.name for c in trace.tool_calls] == ["write_note", "read_note"]
    assert trace.rewards["remembered"].value == 1.0
    offered = {t.get("function", t).get("name") for t in trace.calls[0].tools or []}
    assert {"scratchpad__write_note", "scratchpad__read_note"} <= offered


@pytest.mark.slow
@pytest.mark.bwrap
async def test_a_refused_call_ends_openclaw() -> None:
    """After the interception refuses a call (max_turns=1) OpenClaw is ended, not left
    retrying: the rollout ends by its limit, before the agent budget."""
    need_registry("npm")
    _timed_install("openclaw")
    trace = await _rollout(
        "openclaw", runtime="bwrap", limits=Limits(max_turns=1), timeouts=Timeouts(agent=90)
    )
    check_ended_after_refusal(trace, "openclaw")
