"""The ``codex`` harness: OpenAI's Codex CLI (npm ``@openai/codex``, a native binary inside the
package) from the node's tool dir, run as ``codex exec`` in the Responses dialect against the
interception through a provider entry in its own ``$CODEX_HOME/config.toml``; its JSON event
stream is kept on the trace.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, ClassVar

from vfray.harnesses._codex_skills import SystemSkillSeeds
from vfray.harnesses._npm_harness import NpmAgentConfig, NpmAgentHarness
from vfray.harnesses.base import HarnessConfig, LaunchContext
from vfray.harnesses.chat import openai_base_url
from vfray.harnesses.provisioned import AGENT_DIR
from vfray.runtimes.base import Runtime
from vfray.runtimes.provision import InstalledTool

CODEX_HOME = f"{AGENT_DIR}/codex-home"
EVENTS_PATH = f"{AGENT_DIR}/codex-events.jsonl"
KEY_VAR = "VFRAY_API_KEY"
PROVIDER = "vfray"


class CodexConfig(NpmAgentConfig):
    """Options of the codex harness (its node runs the ``codex`` command, a Node script in
    front of the native binary)."""

    version: str = "0.171.0"
    reasoning_effort: str | None = None
    """``model_reasoning_effort`` in Codex's config; None: Codex's default."""


def config_toml(
    model: str,
    base_url: str,
    reasoning_effort: str | None = None,
    mcp_servers: dict[str, str] | None = None,
) -> str:
    """Codex's config: the interception as the only provider, update checks, analytics and
    feedback off, and the task's MCP servers (streamable HTTP) under ``[mcp_servers.NAME]``."""
    q = json.dumps  # a JSON string is a valid TOML basic string
    lines = [
        f"model = {q(model)}",
        f"model_provider = {q(PROVIDER)}",
        "check_for_update_on_startup = false",
    ]
    if reasoning_effort is not None:
        lines.append(f"model_reasoning_effort = {q(reasoning_effort)}")
    lines += [
        "",
        "[analytics]",
        "enabled = false",
        "",
        "[feedback]",
        "enabled = false",
        "",
        f"[model_providers.{PROVIDER}]",
        f"name = {q(PROVIDER)}",
        f"base_url = {q(base_url)}",
        f"env_key = {q(KEY_VAR)}",
        'wire_api = "responses"',
        "",
    ]
    for name, url in (mcp_servers or {}).items():
        lines += [f"[mcp_servers.{q(name)}]", f"url = {q(url)}", ""]
    return "\n".join(lines)


class CodexHarness(NpmAgentHarness):
    """Codex CLI, non-interactive, no approvals and no sandbox of its own (the box is one); it
    records its session in ``$CODEX_HOME``, which a later segment continues (``exec resume
    --last``)."""

    id = "codex"
    config_type: ClassVar[type[HarnessConfig]] = CodexConfig
    config: CodexConfig
    PACKAGE = "@openai/codex"
    BINARY = "codex"
    EVENTS_PATH = EVENTS_PATH
    BOX_PATHS = ("CODEX_HOME",)
    SKILLS_DIR = f"{CODEX_HOME}/skills"
    SUPPORTS_RESUME = True

    def __init__(self, config: HarnessConfig | Mapping[str, Any] | None = None) -> None:
        super().__init__(config)
        self._skills = SystemSkillSeeds()

    async def prelude(self, runtime: Runtime, tool: InstalledTool) -> str:
        argv = [tool.executable(self.BINARY), "debug", "prompt-input", "."]
        return await self._skills.prelude(runtime, tool, argv)

    async def write_config(self, ctx: LaunchContext, runtime: Runtime) -> None:
        toml = config_toml(
            ctx.model,
            openai_base_url(ctx.endpoint),
            self.config.reasoning_effort,
            ctx.mcp_servers,
        )
        await runtime.write(f"{CODEX_HOME}/config.toml", toml.encode())

    def arguments(self, ctx: LaunchContext, task: str, resumed: bool) -> list[str]:
        return [
            "exec",
            *(["resume", "--last"] if resumed else []),
            "--skip-git-repo-check",
            "--dangerously-bypass-approvals-and-sandbox",
            "--json",
            *self.config.extra_args,
            task,
        ]

    def environment(self, ctx: LaunchContext) -> dict[str, str]:
        return {"CODEX_HOME": CODEX_HOME, KEY_VAR: ctx.secret}
