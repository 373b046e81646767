"""The ``codex`` harness: OpenAI's Codex CLI (npm ``@openai/codex``, a native binary inside the
package) from the node's tool dir, run as ``codex exec`` in the Responses dialect against the
interception through a provider entry in its own ``$CODEX_HOME/config.toml``; its JSON event
stream is kept on the trace.
"""

from __future__ import annotations

import json
from typing import ClassVar

from vfray.harnesses.base import HarnessConfig, LaunchContext
from vfray.harnesses.chat import openai_base_url
from vfray.harnesses.provisioned import (
    AGENT_DIR,
    AgentHarnessConfig,
    ProvisionedHarness,
    prompt_text,
)
from vfray.runtimes.base import ProgramResult, Runtime
from vfray.runtimes.provision import ToolSpec

CODEX_HOME = f"{AGENT_DIR}/codex-home"
EVENTS_PATH = f"{AGENT_DIR}/codex-events.jsonl"
KEY_VAR = "VFRAY_API_KEY"
PROVIDER = "vfray"


class CodexConfig(AgentHarnessConfig):
    """Options of the codex harness."""

    version: str = "0.171.0"
    node_version: str = "22"
    """The npm ``node`` package installed beside it: the ``codex`` command is a Node script
    (``#!/usr/bin/env node``) in front of the native binary, and a node or box may have none."""
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


class CodexHarness(ProvisionedHarness):
    """Codex CLI, non-interactive, no approvals and no sandbox of its own (the box is one)."""

    id = "codex"
    config_type: ClassVar[type[HarnessConfig]] = CodexConfig
    config: CodexConfig
    ARTIFACTS = (EVENTS_PATH,)
    APPENDS_SYSTEM_PROMPT = False
    SUPPORTS_MCP = True
    SUPPORTS_SKILLS = True
    SKILLS_DIR = f"{CODEX_HOME}/skills"

    def tool_spec(self) -> ToolSpec:
        return ToolSpec(
            name="codex",
            kind="npm",
            package="@openai/codex",
            version=self.config.version,
            packages=(f"node@{self.config.node_version}",),
        )

    async def launch(self, ctx: LaunchContext, runtime: Runtime) -> ProgramResult:
        tool = await self.box_tool(runtime)
        toml = config_toml(
            ctx.model,
            openai_base_url(ctx.endpoint),
            self.config.reasoning_effort,
            ctx.mcp_servers,
        )
        await runtime.write(f"{CODEX_HOME}/config.toml", toml.encode())
        task = prompt_text(self.resolve_prompt(ctx.data))
        argv = [
            tool.executable("codex"),
            "exec",
            "--skip-git-repo-check",
            "--dangerously-bypass-approvals-and-sandbox",
            "--ephemeral",
            "--json",
            *self.config.extra_args,
            task,
        ]
        env = {
            # The tool dir's bin holds its own node, which codex's #!/usr/bin/env node finds.
            "PATH": tool.path_env(),
            "CODEX_HOME": CODEX_HOME,
            KEY_VAR: ctx.secret,
            **self.config.env,
        }
        return await self.run_logged(
            runtime,
            argv,
            env,
            stdout_path=EVENTS_PATH,
            timeout=ctx.timeout,
            box_paths=("CODEX_HOME",),
        )
