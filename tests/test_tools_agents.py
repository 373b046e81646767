"""Real agent programs using a task's MCP tools: Claude Code (``--mcp-config``) and Codex
(``[mcp_servers]`` in its config.toml), each against the scripted ``agent`` model calling the
scratchpad's tools by name; the calls land on the trace."""

from __future__ import annotations

import json

import pytest

import vfray as vf
from examples.tools_scratchpad import ScratchpadTaskset
from tests.agent_tools import need_registry
from vfray.harnesses.claude_code import mcp_args
from vfray.harnesses.codex import config_toml


def test_agent_configs_name_the_servers() -> None:
    args = mcp_args({"pad": "http://127.0.0.1:9/mcp/t"}, ("Bash",))
    assert args[:2] == ["--allowedTools", "Bash,mcp__pad"]
    assert '"pad": {"type": "http", "url": "http://127.0.0.1:9/mcp/t"}' in args[3]
    toml = config_toml("m", "http://x/v1", None, {"pad": "http://127.0.0.1:9/mcp/t"})
    assert '[mcp_servers."pad"]\nurl = "http://127.0.0.1:9/mcp/t"' in toml


@pytest.mark.slow
async def test_claude_code_calls_the_scratchpad_over_mcp() -> None:
    need_registry("npm")
    task = ScratchpadTaskset().load()[3]
    trace = await vf.run_rollout(task, model="scripted:agent", harness="claude-code")
    assert trace.errors == [], trace.errors
    assert [c.name for c in trace.tool_calls] == ["write_note", "read_note"]
    assert trace.tool_calls[1].result == "water plants"
    assert trace.rewards["remembered"].value == 1.0
    offered = {t.get("name") for t in trace.calls[0].tools or []}
    assert {"mcp__scratchpad__write_note", "mcp__scratchpad__read_note"} <= offered


@pytest.mark.slow
async def test_codex_calls_the_scratchpad_over_mcp() -> None:
    """Codex connects to the server its config.toml names, offers its tools to the model as a
    Responses ``namespace`` tool, and runs the calls the model makes into that namespace."""
    need_registry("npm")
    task = ScratchpadTaskset().load()[3]
    trace = await vf.run_rollout(task, model="scripted:agent", harness="codex")
    assert trace.errors == [], trace.errors
    assert [c.name for c in trace.tool_calls] == ["write_note", "read_note"]
    assert trace.tool_calls[1].result == "water plants"
    assert trace.rewards["remembered"].value == 1.0
    tools = trace.calls[0].tools or []
    (namespace,) = [t for t in tools if t.get("type") == "namespace" and "scratchpad" in t["name"]]
    assert "read_note" in json.dumps(namespace)
