"""ACP agents with a task's MCP tools and a user: the task's tool servers go to ``session/new`` as
HTTP MCP servers, so ``claude-code-acp`` and ``codex-acp`` (from npm, in bwrap) call the
scratchpad's tools, driven by the scripted ``agent`` model, and the user's second message, sent to
the same live session, is answered with the tools too. Skipped with the reason when npm is
offline."""

from __future__ import annotations

import shutil
from typing import Any

import pytest
from agent_tools import need_registry

import vfray as vf
from examples.tools_scratchpad import NoteData, NoteTask
from vfray.errors import HarnessError
from vfray.harnesses import make_harness
from vfray.harnesses.acp.base import mcp_servers
from vfray.harnesses.provisioned import ProvisionedHarness
from vfray.runtimes.provision import ensure_tool

bwrap_only = pytest.mark.skipif(shutil.which("bwrap") is None, reason="no bwrap")


class NoteWithUser(NoteTask):
    """Write the note in the first segment; the user then asks to read it back."""

    def __init__(self, data: NoteData) -> None:
        super().__init__(data)
        self.then: str | None = f'Now read it back. tool: read_note {{"key": "{data.key}"}}'

    def next_message(self, trace: vf.Trace) -> str | None:
        message, self.then = self.then, None
        return message


def test_acp_session_gets_http_servers_only_from_an_agent_that_announces_them() -> None:
    from acp.schema import AgentCapabilities, InitializeResponse, McpCapabilities

    def init(http: bool) -> Any:
        caps = AgentCapabilities(mcp_capabilities=McpCapabilities(http=http, sse=False))
        return InitializeResponse(protocol_version=1, agent_capabilities=caps)

    assert mcp_servers({}, init(False)) == []
    (server,) = mcp_servers({"pad": "http://127.0.0.1:9/mcp/t"}, init(True))
    dumped = server.model_dump(by_alias=True, exclude_none=True)
    url = "http://127.0.0.1:9/mcp/t"
    assert dumped == {"name": "pad", "url": url, "headers": [], "type": "http"}
    with pytest.raises(HarnessError, match=r"mcpCapabilities\.http"):
        mcp_servers({"pad": "http://127.0.0.1:9/mcp/t"}, init(False))


@pytest.mark.slow
@pytest.mark.bwrap
@bwrap_only
@pytest.mark.parametrize("harness_id", ["claude-code-acp", "codex-acp"])
async def test_acp_agent_uses_the_tasks_tools_across_user_turns(harness_id: str) -> None:
    need_registry("npm")
    harness = make_harness(harness_id)
    assert isinstance(harness, ProvisionedHarness) and harness.SUPPORTS_MCP
    ensure_tool(harness.tool_spec(), harness.tools_root)
    prompt = 'Use the scratchpad. tool: write_note {"key": "n1", "text": "water plants"}'
    task = NoteWithUser(NoteData(prompt=prompt, key="n1", text="water plants", workdir="/box"))
    trace = await vf.run_rollout(task, model="scripted:agent", harness=harness_id, runtime="bwrap")
    assert trace.errors == [], trace.errors
    assert trace.stop_condition is vf.StopCondition.COMPLETED
    assert [c.name for c in trace.tool_calls] == ["write_note", "read_note"]
    assert trace.tool_calls[1].result == "water plants"
    assert trace.rewards["remembered"].value == 1.0
    assert len(trace.segments) == 2 and task.then is None
