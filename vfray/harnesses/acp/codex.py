"""The ``codex-acp`` harness: Codex behind Zed's ACP adapter (npm ``@zed-industries/codex-acp``,
a native binary), one live process per rollout in the Responses dialect against the interception
through the same provider entry as the ``codex`` harness.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from vfray.harnesses._codex_skills import SystemSkillSeeds
from vfray.harnesses.acp.base import AcpHarness, AcpHarnessConfig
from vfray.harnesses.base import HarnessConfig, LaunchContext
from vfray.harnesses.chat import openai_base_url
from vfray.harnesses.codex import CODEX_HOME, KEY_VAR, config_toml
from vfray.runtimes.base import Runtime
from vfray.runtimes.provision import InstalledTool, ToolSpec


class CodexAcpConfig(AcpHarnessConfig):
    """Options of the codex-acp harness."""

    version: str = "0.16.0"
    node_version: str = "22"
    """The npm ``node`` package installed beside it (``codex-acp`` is a Node script in front of
    the native binary)."""
    reasoning_effort: str | None = None
    """``model_reasoning_effort`` in Codex's config; None: Codex's default."""


class CodexAcpHarness(AcpHarness):
    """Codex as a live ACP agent, with no approvals and no sandbox of its own (the box is one)."""

    id = "codex-acp"
    config_type: ClassVar[type[HarnessConfig]] = CodexAcpConfig
    config: CodexAcpConfig
    SUPPORTS_SKILLS = True
    SKILLS_DIR = f"{CODEX_HOME}/skills"

    @classmethod
    def agent_files(cls) -> frozenset[str]:
        """Also the codex harness's home (``CODEX_HOME``, shared with it)."""
        return super().agent_files() | {"codex"}

    def tool_spec(self) -> ToolSpec:
        return ToolSpec(
            name="codex-acp",
            kind="npm",
            package="@zed-industries/codex-acp",
            version=self.config.version,
            packages=(f"node@{self.config.node_version}",),
        )

    def agent_argv(self, tool: InstalledTool) -> list[str]:
        return [tool.executable("codex-acp")]

    BOX_PATHS = ("CODEX_HOME",)

    def __init__(self, config: HarnessConfig | Mapping[str, Any] | None = None) -> None:
        super().__init__(config)
        self._skills = SystemSkillSeeds()

    async def prelude(self, runtime: Runtime, tool: InstalledTool) -> str:
        # Its Codex unpacks its own skills (not the codex harness's) as it starts.
        argv = self.agent_argv(tool)
        return await self._skills.prelude(runtime, tool, argv)

    async def agent_env(
        self, ctx: LaunchContext, runtime: Runtime, tool: InstalledTool
    ) -> dict[str, str]:
        toml = config_toml(ctx.model, openai_base_url(ctx.endpoint), self.config.reasoning_effort)
        # Top-level keys go before the tables config_toml ends with.
        policy = 'approval_policy = "never"\nsandbox_mode = "danger-full-access"\n'
        await runtime.write(f"{CODEX_HOME}/config.toml", (policy + toml).encode())
        return {
            # The tool dir's bin holds its own node, which the script's #!/usr/bin/env node finds.
            "PATH": tool.path_env(),
            "CODEX_HOME": CODEX_HOME,
            KEY_VAR: ctx.secret,
            **self.config.env,
        }
