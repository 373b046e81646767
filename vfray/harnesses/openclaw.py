"""The ``openclaw`` harness: OpenClaw (npm ``openclaw``, with a Node.js 24 from npm in the same
tool dir, as it needs Node >= 24.16) run as ``openclaw agent exec``, its embedded one-shot agent
with no Gateway, in the chat-completions dialect against the interception through a pinned
config naming the interception as its only provider; its JSON result envelope is kept on the
trace.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from vfray.harnesses._npm_harness import NpmAgentConfig, NpmAgentHarness
from vfray.harnesses.base import HarnessConfig, LaunchContext
from vfray.harnesses.chat import openai_base_url
from vfray.harnesses.provisioned import AGENT_DIR
from vfray.runtimes.base import ProgramResult, Runtime

STATE_DIR = f"{AGENT_DIR}/openclaw-state"
CONFIG_PATH = f"{AGENT_DIR}/openclaw.json"
PROMPT_PATH = f"{AGENT_DIR}/openclaw-task.md"
RESULT_PATH = f"{AGENT_DIR}/openclaw-result.json"
SKILLS_DIR = f"{AGENT_DIR}/openclaw-skills"
SKILLS_VAR = "VFRAY_SKILLS_DIR"
KEY_VAR = "VFRAY_API_KEY"
PROVIDER = "vfray"

OPT_OUTS = {
    "OPENCLAW_NO_AUTO_UPDATE": "1",
    "OPENCLAW_DISABLE_BONJOUR": "1",
    "OPENCLAW_SKIP_CHANNELS": "1",
    "OPENCLAW_SKIP_CRON": "1",
    "OPENCLAW_HIDE_BANNER": "1",
    "OPENCLAW_SUPPRESS_NOTES": "1",
    "NO_COLOR": "1",
}
"""No update check, mDNS, chat channels or scheduler: with the config's own opt-outs the program
connects only to the interception."""


class OpenClawConfig(NpmAgentConfig):
    """Options of the openclaw harness."""

    version: str = "2026.9.6"
    node_version: str = "24"
    """The npm ``node`` package installed beside it (OpenClaw needs Node >= 24.16)."""
    """The npm ``node`` package installed beside it (OpenClaw needs Node >= 24.16)."""
    disabled_tools: tuple[str, ...] = ()
    """Tools the agent must not get, as OpenClaw names them (``exec``, ``write``…): its
    ``tools.deny``."""


def openclaw_config(
    model: str,
    base_url: str,
    disabled_tools: tuple[str, ...] = (),
    mcp_servers: dict[str, str] | None = None,
    skills: bool = False,
) -> str:
    """OpenClaw's pinned config: the interception as the only provider (its key read from the
    environment), ``model`` the primary with no fallback, the coding tool profile, and update
    checks, telemetry, diagnostics and the background recap model off, and the task's MCP
    servers (streamable HTTP) under ``mcp.servers``; with ``skills``, the folder they are
    installed in (its absolute path from the environment) under ``skills.load.extraDirs``."""
    config: dict[str, Any] = {
        "agents": {
            "defaults": {
                "model": {"primary": f"{PROVIDER}/{model}"},
                "skipBootstrap": True,
                "heartbeat": {"every": "0m"},
                "sandbox": {"mode": "off"},
                "utilityModel": "",
            }
        },
        "models": {
            "providers": {
                PROVIDER: {
                    "baseUrl": base_url,
                    "apiKey": f"${{{KEY_VAR}}}",
                    "api": "openai-completions",
                    "models": [{"id": model, "name": model, "reasoning": False, "input": ["text"]}],
                }
            }
        },
        "tools": {
            "profile": "coding",
            "deny": list(disabled_tools),
            # With MCP servers, no Tool Search: their tools are declared to the model, not left
            # for it to find (which also declares the rest of the catalog).
            **({"toolSearch": False} if mcp_servers else {}),
        },
        "update": {"checkOnStart": False},
        "telemetry": {"enabled": False},
        "diagnostics": {"enabled": False},
        "mcp": {
            "servers": {
                name: {"url": url, "transport": "streamable-http"}
                for name, url in (mcp_servers or {}).items()
            }
        },
    }
    if skills:
        config["skills"] = {"load": {"extraDirs": [f"${{{SKILLS_VAR}}}"]}}
    return json.dumps(config, indent=2)


class OpenClawHarness(NpmAgentHarness):
    """OpenClaw's ``agent exec``: one embedded turn, its state kept in the box's agent dir.

    It cannot resume (a task that continues through ``next_message`` is refused up front):
    ``agent exec`` runs "one isolated headless embedded agent turn" and has no session flag;
    sessions belong to ``openclaw agent`` (``--session-id``), which runs through a Gateway, or
    ``--local`` on the ambient config, not the pinned one this harness gives it."""

    id = "openclaw"
    config_type: ClassVar[type[HarnessConfig]] = OpenClawConfig
    config: OpenClawConfig
    PACKAGE = "openclaw"
    BINARY = "openclaw"
    EVENTS_PATH = RESULT_PATH
    BOX_PATHS = ("HOME", "OPENCLAW_HOME", SKILLS_VAR)
    SKILLS_DIR = SKILLS_DIR

    async def write_config(self, ctx: LaunchContext, runtime: Runtime) -> None:
        c = self.config
        config = openclaw_config(
            ctx.model,
            openai_base_url(ctx.endpoint),
            c.disabled_tools,
            ctx.mcp_servers,
            skills=bool(c.skills),
        )
        await runtime.write(CONFIG_PATH, config.encode())
        # --state-dir must exist; the task goes in a file (a prompt may start with a dash).
        await runtime.write(f"{STATE_DIR}/.keep", b"")

    async def _run(
        self, ctx: LaunchContext, runtime: Runtime, task: str, *, resumed: bool
    ) -> ProgramResult:
        await runtime.write(PROMPT_PATH, task.encode())
        return await super()._run(ctx, runtime, task, resumed=resumed)

    def arguments(self, ctx: LaunchContext, task: str, resumed: bool) -> list[str]:
        return [
            "agent",
            "exec",
            "--config",
            CONFIG_PATH,
            "--state-dir",
            STATE_DIR,
            "--message-file",
            PROMPT_PATH,
            "--model",
            f"{PROVIDER}/{ctx.model}",
            "--json",
            # vfray's agent budget is the deadline.
            "--timeout",
            "0",
            *self.config.extra_args,
        ]

    def environment(self, ctx: LaunchContext) -> dict[str, str]:
        return {
            "HOME": STATE_DIR,
            "OPENCLAW_HOME": STATE_DIR,
            SKILLS_VAR: SKILLS_DIR,
            KEY_VAR: ctx.secret,
            **OPT_OUTS,
        }
