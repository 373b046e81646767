"""The ``qwen-code`` harness: Qwen Code (npm ``@qwen-code/qwen-code``, a Gemini CLI fork, with a
Node.js 22 from npm in the same tool dir, as it needs Node >= 22) run headless as ``qwen
--output-format stream-json`` in the OpenAI chat-completions dialect against the interception;
its settings (usage statistics, telemetry and update checks off, the task's MCP servers) live in
its own ``$QWEN_HOME``, and its stream-json transcript is kept on the trace.
"""

from __future__ import annotations

import json
from typing import ClassVar

from vfray.harnesses._npm_harness import NpmAgentConfig, NpmAgentHarness
from vfray.harnesses.base import HarnessConfig, LaunchContext
from vfray.harnesses.chat import openai_base_url
from vfray.harnesses.provisioned import AGENT_DIR
from vfray.runtimes.base import Runtime

QWEN_HOME = f"{AGENT_DIR}/qwen-home"
EVENTS_PATH = f"{AGENT_DIR}/qwen-events.jsonl"

OPT_OUTS = {
    "QWEN_USAGE_STATISTICS_ENABLED": "false",
    "QWEN_TELEMETRY_ENABLED": "false",
    # It otherwise re-executes itself under a second node with a bigger heap: twice the start.
    "QWEN_CODE_NO_RELAUNCH": "true",
    "QWEN_CODE_SUPPRESS_YOLO_WARNING": "1",  # the box is the sandbox
}
"""With these (and :func:`settings`) the program connects only to the interception."""


class QwenCodeConfig(NpmAgentConfig):
    """Options of the qwen-code harness (its node: Qwen Code needs Node >= 22)."""

    version: str = "0.24.4"
    disabled_tools: tuple[str, ...] = ()
    """Tools the agent must not get, as Qwen Code names them (``run_shell_command``,
    ``web_fetch``): passed as ``--exclude-tools``."""


def settings(mcp_servers: dict[str, str] | None = None) -> dict[str, object]:
    """Qwen Code's ``settings.json``: OpenAI-compatible auth, no usage statistics, telemetry,
    update checks or ripgrep, and the task's MCP servers (streamable HTTP), offered directly."""
    found: dict[str, object] = {
        "general": {"enableAutoUpdate": False},
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
        "security": {"auth": {"selectedType": "openai"}},
        # Its bundled rg comes without an executable bit, which the read-only tool dir keeps:
        # each start would try it, fail, and fall back to the built-in search anyway.
        "tools": {"useRipgrep": False},
    }
    if mcp_servers:
        found["mcpServers"] = {name: {"httpUrl": url} for name, url in mcp_servers.items()}
        # Otherwise MCP tools are deferred behind its tool_search/tool_call pair: the model
        # would see only those, not the task's tools.
        found["tools"] = {"useRipgrep": False, "toolSearch": {"enabled": False}}
    return found


class QwenCodeHarness(NpmAgentHarness):
    """Qwen Code, headless, every tool call approved (``--yolo``: the box is the sandbox); a
    later segment continues the session it recorded in its home (``--continue``)."""

    id = "qwen-code"
    config_type: ClassVar[type[HarnessConfig]] = QwenCodeConfig
    config: QwenCodeConfig
    PACKAGE = "@qwen-code/qwen-code"
    BINARY = "qwen"
    EVENTS_PATH = EVENTS_PATH
    BOX_PATHS = ("QWEN_HOME",)
    SKILLS_DIR = f"{QWEN_HOME}/skills"
    SUPPORTS_RESUME = True

    async def write_config(self, ctx: LaunchContext, runtime: Runtime) -> None:
        found = settings(ctx.mcp_servers)
        await runtime.write(f"{QWEN_HOME}/settings.json", json.dumps(found).encode())

    def arguments(self, ctx: LaunchContext, task: str, resumed: bool) -> list[str]:
        c = self.config
        return [
            # The task as its positional prompt, first: after a flag that takes many values
            # (``--exclude-tools``) it would be read as one of them.
            task,
            "--auth-type",
            "openai",
            "--model",
            ctx.model,
            "--yolo",
            "--output-format",
            "stream-json",
            "--max-session-turns",
            str(c.max_steps),
            # A later segment continues the session the last one recorded in its home.
            *(["--continue"] if resumed else []),
            *(["--exclude-tools", *c.disabled_tools] if c.disabled_tools else []),
            *c.extra_args,
        ]

    def environment(self, ctx: LaunchContext) -> dict[str, str]:
        return {
            "QWEN_HOME": QWEN_HOME,
            "OPENAI_BASE_URL": openai_base_url(ctx.endpoint),
            "OPENAI_API_KEY": ctx.secret,
            "OPENAI_MODEL": ctx.model,
            **OPT_OUTS,
        }
