"""The ``claude-code`` harness: Anthropic's Claude Code (npm ``@anthropic-ai/claude-code``, with
a Node.js 22 from npm in the same tool dir, as it needs Node >= 22) run as ``claude -p`` in the
Anthropic dialect against the interception; its stream-json transcript is kept on the trace.
"""

from __future__ import annotations

import json
from typing import ClassVar

from vfray.harnesses._npm_harness import NpmAgentConfig, NpmAgentHarness
from vfray.harnesses.base import HarnessConfig, LaunchContext
from vfray.harnesses.provisioned import AGENT_DIR
from vfray.runtimes.base import Runtime

CONFIG_DIR = f"{AGENT_DIR}/claude-config"
EVENTS_PATH = f"{AGENT_DIR}/claude-events.jsonl"

OPT_OUTS = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_ERROR_REPORTING": "1",
}
"""With these the program connects only to the interception (observed, see agents.md)."""


class ClaudeCodeConfig(NpmAgentConfig):
    """Options of the claude-code harness (its node: Claude Code needs Node >= 22)."""

    version: str = "2.1.332"
    allowed_tools: tuple[str, ...] = ("Bash", "Read", "Edit", "Write")
    """Tools the agent may use without asking (print mode cannot ask)."""
    disabled_tools: tuple[str, ...] = ()
    """Tools the agent must not get, as Claude Code names them (``WebFetch``, a task's MCP
    tool as ``mcp__SERVER__TOOL``): passed as ``--disallowedTools``."""


def anthropic_root(endpoint: str) -> str:
    """The interception root an Anthropic client wants: the endpoint without ``/v1``."""
    return endpoint.rstrip("/").removesuffix("/v1")


def mcp_args(servers: dict[str, str], allowed: tuple[str, ...]) -> list[str]:
    """``--mcp-config`` naming only the task's servers (``--strict-mcp-config``: none from a
    user config), and each server's tools allowed (``mcp__NAME``: print mode cannot ask)."""
    allowed = (*allowed, *(f"mcp__{name}" for name in servers))
    args = ["--allowedTools", ",".join(allowed)] if allowed else []
    if servers:
        config = {"mcpServers": {n: {"type": "http", "url": u} for n, u in servers.items()}}
        args += ["--mcp-config", json.dumps(config), "--strict-mcp-config"]
    return args


class ClaudeCodeHarness(NpmAgentHarness):
    """Claude Code in print mode with stream-json output; a later segment continues the
    session it saved in its config home (``--continue``)."""

    id = "claude-code"
    config_type: ClassVar[type[HarnessConfig]] = ClaudeCodeConfig
    config: ClaudeCodeConfig
    PACKAGE = "@anthropic-ai/claude-code"
    BINARY = "claude"
    EVENTS_PATH = EVENTS_PATH
    BOX_PATHS = ("CLAUDE_CONFIG_DIR",)
    SKILLS_DIR = f"{CONFIG_DIR}/skills"
    SUPPORTS_RESUME = True

    async def write_config(self, ctx: LaunchContext, runtime: Runtime) -> None:
        # Its config home must exist before the stdout redirect into the same folder.
        await runtime.write(f"{CONFIG_DIR}/.keep", b"")

    def arguments(self, ctx: LaunchContext, task: str, resumed: bool) -> list[str]:
        c = self.config
        allowed = tuple(t for t in c.allowed_tools if t not in c.disabled_tools)
        return [
            "-p",
            task,
            # A later segment continues the session the last one saved for this work dir.
            *(["--continue"] if resumed else []),
            "--output-format",
            "stream-json",
            "--verbose",
            "--model",
            ctx.model,
            "--max-turns",
            str(c.max_steps),
            *mcp_args(ctx.mcp_servers, allowed),
            *(["--disallowedTools", ",".join(c.disabled_tools)] if c.disabled_tools else []),
            *c.extra_args,
        ]

    def environment(self, ctx: LaunchContext) -> dict[str, str]:
        return {
            "ANTHROPIC_BASE_URL": anthropic_root(ctx.endpoint),
            "ANTHROPIC_API_KEY": ctx.secret,
            "CLAUDE_CONFIG_DIR": CONFIG_DIR,
            **OPT_OUTS,
            # Otherwise MCP tools are deferred behind a ToolSearch tool: the model would see
            # only a placeholder, not the task's tools.
            **({"ENABLE_TOOL_SEARCH": "false"} if ctx.mcp_servers else {}),
        }
