"""The ``pi`` harness: Pi (npm) installed into the node's tool dir, one scored rollout against the
scripted ``agent`` model through the interception in bwrap and in docker, and a refused call
that ends the program. Skipped with the reason when npm (or the engine) is unavailable.
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
from vfray.harnesses.pi import PiConfig, PiHarness, mcp_json, model_failure, models_json
from vfray.interception import Limits
from vfray.rollout import Timeouts


def test_pi_is_registered_with_a_typed_config() -> None:
    assert "pi" in available_harnesses()
    pi = make_harness("pi", {"disabled_tools": ["edit"]})
    assert isinstance(pi.config, PiConfig) and pi.config.disabled_tools == ("edit",)
    assert pi.EXECUTES_CODE and not pi.NEEDS_CONTAINER
    old = make_harness("pi", {"package": "@mariozechner/pi-coding-agent", "version": "0.73.1"})
    assert isinstance(old, PiHarness)
    assert old.tool_spec().requirement == "@mariozechner/pi-coding-agent@0.73.1"
    with pytest.raises(ConfigError, match="pi"):
        make_harness("pi", {"no_such_option": 1})


def test_pi_models_json_names_the_interception_as_its_only_provider() -> None:
    config = json.loads(models_json("scripted:agent", "http://127.0.0.1:9/v1"))
    assert config == {
        "providers": {
            "vfray": {
                "baseUrl": "http://127.0.0.1:9/v1",
                "api": "openai-completions",
                "apiKey": "$VFRAY_API_KEY",
                "models": [{"id": "scripted:agent", "reasoning": False, "input": ["text"]}],
            }
        }
    }


def test_pi_mcp_json_declares_the_tasks_servers_directly() -> None:
    config = json.loads(mcp_json({"pad": "http://127.0.0.1:9/mcp/t"}))
    assert config == {
        "mcpServers": {"pad": {"url": "http://127.0.0.1:9/mcp/t", "exposure": "direct"}}
    }


def test_a_failed_model_call_in_pis_events_is_found() -> None:
    end = {"type": "message_end", "message": {"role": "assistant", "stopReason": "stop"}}
    assert model_failure(json.dumps(end) + "\n" + json.dumps({"type": "agent_settled"})) is None
    failed = {"role": "assistant", "stopReason": "error", "errorMessage": "401: unknown API key"}
    events = [json.dumps({"type": "message_end", "message": failed}), "not json", "[]"]
    assert model_failure("\n".join(events)) == "pi: the model call failed: 401: unknown API key"


def _check_events(trace: vf.Trace) -> None:
    (artifact,) = trace.artifacts
    events = [json.loads(line) for line in artifact.content.splitlines() if line.strip()]
    assert events[0]["type"] == "session"
    commands = [
        part["arguments"]["command"]
        for e in events
        if e["type"] == "message_end" and e["message"]["role"] == "assistant"
        for part in e["message"]["content"]
        if part["type"] == "toolCall"
    ]
    assert commands == ["printf '%s\\n' 'hello agent' > out.txt", "cat out.txt"]


@pytest.mark.slow
@pytest.mark.bwrap
async def test_pi_rollout_in_bwrap(tmp_path: Path) -> None:
    """Also with a skill: its SKILL.md, installed into the agent's own skills folder, is
    offered to the model in the first request."""
    need_registry("npm")
    _timed_install("pi")
    skills = {"skills": [str(make_skill(tmp_path))]}
    trace = await _rollout("pi", runtime="bwrap", harness_options=skills)
    assert DESCRIPTION in _request_text(trace)
    # write, cat, final answer: three chat-completions calls.
    _check_solved(trace, calls=3)
    _check_events(trace)


@pytest.mark.slow
@pytest.mark.docker
async def test_pi_rollout_in_docker(docker_url: str) -> None:
    need_registry("npm")
    _timed_install("pi")
    trace = await _rollout("pi", runtime="docker", runtime_options=runtime_options(docker_url))
    _check_solved(trace, calls=3)
    _check_events(trace)


@pytest.mark.slow
@pytest.mark.bwrap
async def test_pi_calls_the_scratchpad_over_mcp() -> None:
    """Pi connects to the server its mcp.json names and offers its tools as
    ``mcp__SERVER__TOOL``; the scripted model calls them by name."""
    need_registry("npm")
    _timed_install("pi")
    task = ScratchpadTaskset().load()[3]
    trace = await vf.run_rollout(task, model="scripted:agent", harness="pi", runtime="bwrap")
    assert trace.errors == [], trace.errors
    assert [c.name for c in trace.tool_calls] == ["write_note", "read_note"]
    assert trace.rewards["remembered"].value == 1.0
    offered = {t.get("function", t).get("name") for t in trace.calls[0].tools or []}
    assert {"mcp__scratchpad__write_note", "mcp__scratchpad__read_note"} <= offered


@pytest.mark.slow
@pytest.mark.bwrap
async def test_a_refused_call_ends_pi() -> None:
    """After the interception refuses a call (max_turns=1) Pi is ended, not left retrying: the
    rollout ends by its limit, before the agent budget."""
    need_registry("npm")
    _timed_install("pi")
    trace = await _rollout(
        "pi", runtime="bwrap", limits=Limits(max_turns=1), timeouts=Timeouts(agent=90)
    )
    check_ended_after_refusal(trace, "pi")


@pytest.mark.slow
@pytest.mark.bwrap
async def test_an_unknown_key_fails_pis_rollout() -> None:
    """Pi's print mode exits 0 after a 401; the harness reads the failure from its events, so
    the rollout records a HarnessError instead of a clean run that wrote nothing."""
    need_registry("npm")
    _timed_install("pi")
    env = {"VFRAY_API_KEY": "sk-vfray-unknown-key"}
    trace = await _rollout("pi", runtime="bwrap", harness_options={"env": env})
    assert trace.errors and trace.errors[0].type == "HarnessError", trace.errors
    assert "unknown API key" in trace.errors[0].message
    assert trace.calls == []
