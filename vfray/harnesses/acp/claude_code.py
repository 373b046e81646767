"""The ``claude-code-acp`` harness: Claude Code behind Zed's ACP adapter (npm
``@zed-industries/claude-code-acp``, with a Node.js 22 from npm in the same tool dir), one live
process per rollout in the Anthropic dialect against the interception.
"""

from __future__ import annotations

from typing import ClassVar

from vfray.harnesses.acp.base import AcpHarness, AcpHarnessConfig
from vfray.harnesses.base import HarnessConfig, LaunchContext
from vfray.harnesses.claude_code import CONFIG_DIR, OPT_OUTS, anthropic_root
from vfray.runtimes.base import Runtime
from vfray.runtimes.provision import InstalledTool, ToolSpec


class ClaudeCodeAcpConfig(AcpHarnessConfig):
    """Options of the claude-code-acp harness."""

    version: str = "0.16.2"
    node_version: str = "22"
    """The npm ``node`` package installed beside it (Claude Code needs Node >= 22)."""


class ClaudeCodeAcpHarness(AcpHarness):
    """Claude Code as a live ACP agent; its permission requests are granted by the client."""

    id = "claude-code-acp"
    config_type: ClassVar[type[HarnessConfig]] = ClaudeCodeAcpConfig
    config: ClaudeCodeAcpConfig
    SUPPORTS_SKILLS = True
    SKILLS_DIR = f"{CONFIG_DIR}/skills"

    @classmethod
    def agent_files(cls) -> frozenset[str]:
        """Also the claude-code harness's home (``CONFIG_DIR``, shared with it)."""
        return super().agent_files() | {"claude-code"}

    def tool_spec(self) -> ToolSpec:
        return ToolSpec(
            name="claude-code-acp",
            kind="npm",
            package="@zed-industries/claude-code-acp",
            version=self.config.version,
            packages=(f"node@{self.config.node_version}",),
        )

    def agent_argv(self, tool: InstalledTool) -> list[str]:
        return [tool.executable("claude-code-acp")]

    BOX_PATHS = ("CLAUDE_CONFIG_DIR",)

    async def agent_env(
        self, ctx: LaunchContext, runtime: Runtime, tool: InstalledTool
    ) -> dict[str, str]:
        await runtime.write(f"{CONFIG_DIR}/.keep", b"")
        return {
            # The tool dir's bin holds its own node, which the adapter's #!/usr/bin/env node finds.
            "PATH": tool.path_env(),
            "ANTHROPIC_BASE_URL": anthropic_root(ctx.endpoint),
            "ANTHROPIC_API_KEY": ctx.secret,
            "ANTHROPIC_MODEL": ctx.model,
            "ANTHROPIC_SMALL_FAST_MODEL": ctx.model,
            "CLAUDE_CONFIG_DIR": CONFIG_DIR,
            **OPT_OUTS,
            # Else MCP tools hide behind a ToolSearch tool (as in the claude-code harness).
            **({"ENABLE_TOOL_SEARCH": "false"} if ctx.mcp_servers else {}),
            **self.config.env,
        }
