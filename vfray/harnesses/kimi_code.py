"""The ``kimi-code`` harness: Moonshot's Kimi Code (npm ``@moonshot-ai/kimi-code``, with a
Node.js 22 from npm in the same tool dir) run as ``kimi -p --output-format stream-json``
in the chat-completions dialect against the interception, its model given by Kimi Code's
``KIMI_MODEL_*`` variables; its stream-json transcript is kept on the trace.
"""

from __future__ import annotations

import json
from typing import ClassVar

from vfray.harnesses._npm_harness import NpmAgentConfig, NpmAgentHarness
from vfray.harnesses.base import HarnessConfig, LaunchContext
from vfray.harnesses.chat import openai_base_url
from vfray.harnesses.provisioned import AGENT_DIR
from vfray.runtimes.base import Runtime

KIMI_HOME = f"{AGENT_DIR}/kimi-home"
EVENTS_PATH = f"{AGENT_DIR}/kimi-events.jsonl"

OPT_OUTS = {
    "KIMI_DISABLE_TELEMETRY": "1",
    "KIMI_CODE_NO_AUTO_UPDATE": "1",
    "KIMI_CLI_NO_AUTO_UPDATE": "1",
    "KIMI_CODE_MODEL_CATALOG_REFRESH_ON_START": "0",
    "KIMI_DISABLE_CRON": "1",
}
"""Telemetry, update checks, the model catalog refresh and the scheduler off: the program's only
connections are the model calls, to the interception."""


class KimiCodeConfig(NpmAgentConfig):
    """Options of the kimi-code harness."""

    version: str = "2.1.0"


def mcp_json(servers: dict[str, str]) -> str:
    """Kimi Code's user-level ``mcp.json`` (in its home): the task's servers, streamable HTTP."""
    return json.dumps({"mcpServers": {n: {"url": u} for n, u in servers.items()}}, indent=2)


class KimiCodeHarness(NpmAgentHarness):
    """Kimi Code in prompt mode (which runs its tools without asking); a later segment
    continues the work dir's session it saved in its home (``--continue``)."""

    id = "kimi-code"
    config_type: ClassVar[type[HarnessConfig]] = KimiCodeConfig
    config: KimiCodeConfig
    PACKAGE = "@moonshot-ai/kimi-code"
    BINARY = "kimi"
    EVENTS_PATH = EVENTS_PATH
    BOX_PATHS = ("HOME", "KIMI_CODE_HOME")
    SKILLS_DIR = f"{KIMI_HOME}/skills"
    SUPPORTS_RESUME = True

    async def write_config(self, ctx: LaunchContext, runtime: Runtime) -> None:
        # Its home must exist before the stdout redirect into the same folder.
        await runtime.write(f"{KIMI_HOME}/.keep", b"")
        if ctx.mcp_servers:
            await runtime.write(f"{KIMI_HOME}/mcp.json", mcp_json(ctx.mcp_servers).encode())

    def arguments(self, ctx: LaunchContext, task: str, resumed: bool) -> list[str]:
        c = self.config
        return [
            "--prompt",
            task,
            "--output-format",
            "stream-json",
            # A later segment continues the session the last one left for this work dir.
            *(["--continue"] if resumed else []),
            *(["--skills-dir", self.SKILLS_DIR] if c.skills else []),
            *c.extra_args,
        ]

    def environment(self, ctx: LaunchContext) -> dict[str, str]:
        return {
            "HOME": KIMI_HOME,
            "KIMI_CODE_HOME": KIMI_HOME,
            "KIMI_MODEL_NAME": ctx.model,
            "KIMI_MODEL_API_KEY": ctx.secret,
            "KIMI_MODEL_BASE_URL": openai_base_url(ctx.endpoint),
            "KIMI_MODEL_PROVIDER_TYPE": "openai",
            "KIMI_LOOP_MAX_STEPS_PER_TURN": str(self.config.max_steps),
            **OPT_OUTS,
        }
