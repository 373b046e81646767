"""The ``gemini-cli`` harness: Gemini CLI (npm) installed into the node's tool dir, one scored
rollout against the scripted ``agent`` model through the interception's Gemini dialect in bwrap
and in docker, and a refused call that ends the program. Skipped with the reason when npm (or
the engine) is unavailable.
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
from vfray.harnesses.gemini_cli import GeminiCliConfig, gemini_root, settings
from vfray.interception import Limits
from vfray.rollout import Timeouts


def test_gemini_cli_is_registered_with_a_typed_config() -> None:
    assert "gemini-cli" in available_harnesses()
    gemini = make_harness("gemini-cli", {"disabled_tools": ["web_fetch"]})
    assert isinstance(gemini.config, GeminiCliConfig)
    assert gemini.config.disabled_tools == ("web_fetch",)
    assert gemini.EXECUTES_CODE and not gemini.NEEDS_CONTAINER and gemini.SUPPORTS_MCP
    assert gemini.SUPPORTS_SKILLS
    with pytest.raises(ConfigError, match="gemini-cli"):
        make_harness("gemini-cli", {"no_such_option": 1})


def test_gemini_cli_settings_turn_off_everything_but_the_interception() -> None:
    found = settings(7, ("web_fetch",), {"notes": "http://127.0.0.1:9/mcp"})
    assert found["privacy"] == {"usageStatisticsEnabled": False}
    assert found["telemetry"] == {"enabled": False}
    assert found["general"] == {"enableAutoUpdate": False, "enableAutoUpdateNotification": False}
    assert found["security"] == {
        "auth": {"selectedType": "gemini-api-key"},
        "folderTrust": {"enabled": False},
    }
    assert found["model"] == {"maxSessionTurns": 7}
    assert found["tools"] == {"useRipgrep": False, "exclude": ["web_fetch"]}
    assert found["mcpServers"] == {"notes": {"httpUrl": "http://127.0.0.1:9/mcp"}}
    assert "mcpServers" not in settings(1) and settings(1)["tools"] == {"useRipgrep": False}
    # The SDK appends /v1beta/models/...: it wants the interception's root.
    assert gemini_root("http://10.0.2.2:41/v1") == "http://10.0.2.2:41"


def _check_events(trace: vf.Trace) -> None:
    (artifact,) = trace.artifacts
    events = [json.loads(line) for line in artifact.content.splitlines() if line.strip()]
    assert events[-1]["type"] == "result" and events[-1]["status"] == "success", events[-1]
    commands = [
        e["parameters"]["command"]
        for e in events
        if e["type"] == "tool_use" and e["tool_name"] == "run_shell_command"
    ]
    assert commands == ["printf '%s\\n' 'hello agent' > out.txt", "cat out.txt"]


def _check_dialect(trace: vf.Trace) -> None:
    assert {c.dialect for c in trace.calls} == {"gemini"} and len(trace.branch_list) == 1


@pytest.mark.slow
@pytest.mark.bwrap
async def test_gemini_cli_rollout_in_bwrap(tmp_path: Path) -> None:
    """Also with a disabled tool, not offered to the model, and a skill: its SKILL.md,
    installed into the agent's own skills folder, is offered in the first request."""
    need_registry("npm")
    _timed_install("gemini-cli")
    options = {"disabled_tools": ["google_web_search"], "skills": [str(make_skill(tmp_path))]}
    trace = await _rollout("gemini-cli", runtime="bwrap", harness_options=options)
    # write, cat, final answer: three streamed Gemini calls offering run_shell_command.
    _check_solved(trace, calls=3)
    offered = {tool["function"]["name"] for tool in trace.calls[0].tools or []}
    assert "run_shell_command" in offered and "google_web_search" not in offered, offered
    assert DESCRIPTION in _request_text(trace)
    _check_dialect(trace)
    _check_events(trace)


@pytest.mark.slow
@pytest.mark.docker
async def test_gemini_cli_rollout_in_docker(docker_url: str) -> None:
    need_registry("npm")
    _timed_install("gemini-cli")
    trace = await _rollout(
        "gemini-cli", runtime="docker", runtime_options=runtime_options(docker_url)
    )
    _check_solved(trace, calls=3)
    _check_dialect(trace)
    _check_events(trace)


@pytest.mark.slow
@pytest.mark.bwrap
async def test_a_refused_call_ends_gemini_cli() -> None:
    """After the interception refuses a call (max_turns=1) Gemini CLI is ended, not left
    retrying: the rollout ends by its limit, before the agent budget."""
    need_registry("npm")
    _timed_install("gemini-cli")
    trace = await _rollout(
        "gemini-cli", runtime="bwrap", limits=Limits(max_turns=1), timeouts=Timeouts(agent=90)
    )
    check_ended_after_refusal(trace, "gemini-cli")


@pytest.mark.slow
async def test_gemini_cli_calls_the_scratchpad_over_mcp() -> None:
    """The task's MCP server, named in its settings, is offered to the model and called."""
    need_registry("npm")
    _timed_install("gemini-cli")
    task = ScratchpadTaskset().load()[3]
    trace = await vf.run_rollout(task, model="scripted:agent", harness="gemini-cli")
    assert trace.errors == [], trace.errors
    assert [c.name for c in trace.tool_calls] == ["write_note", "read_note"]
    assert trace.tool_calls[1].result == "water plants"
    assert trace.rewards["remembered"].value == 1.0
