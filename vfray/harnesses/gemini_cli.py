"""The ``gemini-cli`` harness: Gemini CLI (npm ``@google/gemini-cli``, with a Node.js 22 from npm
in the same tool dir) run headless as ``gemini -p TASK --output-format stream-json`` against the
interception's Gemini dialect (``GOOGLE_GEMINI_BASE_URL``, the rollout's key as
``GEMINI_API_KEY``: the only way Gemini CLI reaches a custom endpoint); its settings (usage
statistics, telemetry and update checks off, the task's MCP servers) and skills live in its
own ``$GEMINI_CLI_HOME``, and its stream-json transcript is kept on the trace.
"""

from __future__ import annotations

import json
from typing import ClassVar

from vfray.harnesses._npm_harness import NpmAgentConfig, NpmAgentHarness
from vfray.harnesses.base import HarnessConfig, LaunchContext
from vfray.harnesses.provisioned import AGENT_DIR
from vfray.runtimes.base import Runtime

GEMINI_HOME = f"{AGENT_DIR}/gemini-home"
"""``$GEMINI_CLI_HOME``: Gemini CLI reads ``.gemini/settings.json`` under it."""
EVENTS_PATH = f"{AGENT_DIR}/gemini-events.jsonl"

OPT_OUTS = {
    # It otherwise re-executes itself under a second node with a bigger heap: twice the start.
    "GEMINI_CLI_NO_RELAUNCH": "true",
    "GEMINI_CLI_TRUST_WORKSPACE": "true",  # the box is the sandbox: no trust prompt or downgrade
}
"""With these (and :func:`settings`) the program connects only to the interception."""


class GeminiCliConfig(NpmAgentConfig):
    """Options of the gemini-cli harness (its node: Gemini CLI needs Node >= 20)."""

    version: str = "0.61.0"
    disabled_tools: tuple[str, ...] = ()
    """Tools the agent must not get, as Gemini CLI names them (``run_shell_command``,
    ``web_fetch``, ``google_web_search``): its ``tools.exclude`` setting."""


def gemini_root(endpoint: str) -> str:
    """The interception root the Gemini SDK wants (it adds ``/v1beta/models/...``)."""
    return endpoint.rstrip("/").removesuffix("/v1")


def settings(
    max_steps: int, disabled_tools: tuple[str, ...] = (), mcp_servers: dict[str, str] | None = None
) -> dict[str, object]:
    """Gemini CLI's ``settings.json``: API-key auth (its base URL comes from the environment),
    no usage statistics, telemetry, update checks, folder trust or ripgrep download, at most
    ``max_steps`` turns, and the task's MCP servers (streamable HTTP)."""
    tools: dict[str, object] = {"useRipgrep": False}
    if disabled_tools:
        tools["exclude"] = list(disabled_tools)
    found: dict[str, object] = {
        "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
        "security": {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": False}},
        "model": {"maxSessionTurns": max_steps},
        "tools": tools,
    }
    if mcp_servers:
        found["mcpServers"] = {name: {"httpUrl": url} for name, url in mcp_servers.items()}
    return found


class GeminiCliHarness(NpmAgentHarness):
    """Gemini CLI, headless, every tool call approved (``--yolo``: the box is the sandbox); a
    later segment continues the session it saved in its home (``--resume latest``)."""

    id = "gemini-cli"
    config_type: ClassVar[type[HarnessConfig]] = GeminiCliConfig
    config: GeminiCliConfig
    PACKAGE = "@google/gemini-cli"
    BINARY = "gemini"
    EVENTS_PATH = EVENTS_PATH
    BOX_PATHS = ("GEMINI_CLI_HOME",)
    SKILLS_DIR = f"{GEMINI_HOME}/.gemini/skills"
    SUPPORTS_RESUME = True

    async def write_config(self, ctx: LaunchContext, runtime: Runtime) -> None:
        c = self.config
        found = settings(c.max_steps, c.disabled_tools, ctx.mcp_servers)
        await runtime.write(f"{GEMINI_HOME}/.gemini/settings.json", json.dumps(found).encode())

    def arguments(self, ctx: LaunchContext, task: str, resumed: bool) -> list[str]:
        return [
            "--prompt",
            task,
            "--model",
            ctx.model,
            "--yolo",
            "--output-format",
            "stream-json",
            # A later segment continues the session the last one saved in its home.
            *(["--resume", "latest"] if resumed else []),
            *self.config.extra_args,
        ]

    def environment(self, ctx: LaunchContext) -> dict[str, str]:
        return {
            "GEMINI_CLI_HOME": GEMINI_HOME,
            "GOOGLE_GEMINI_BASE_URL": gemini_root(ctx.endpoint),
            "GEMINI_API_KEY": ctx.secret,
            **OPT_OUTS,
        }
