"""The ``pi`` harness: Pi, the coding agent (npm ``@earendil-works/pi-coding-agent``, named
``@mariozechner/pi-coding-agent`` before 0.74, with a Node.js 22 from npm in the same tool dir)
run as ``pi -p --mode json`` in the chat-completions dialect against the interception, through a
provider entry in its own ``models.json``; its JSON event stream is kept on the trace.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar

from vfray.harnesses._npm_harness import NpmAgentConfig, NpmAgentHarness
from vfray.harnesses.base import HarnessConfig, LaunchContext
from vfray.harnesses.chat import openai_base_url
from vfray.harnesses.provisioned import AGENT_DIR
from vfray.runtimes.base import ProgramResult, Runtime

PI_DIR = f"{AGENT_DIR}/pi-agent"
EVENTS_PATH = f"{AGENT_DIR}/pi-events.jsonl"
KEY_VAR = "VFRAY_API_KEY"
PROVIDER = "vfray"

OPT_OUTS = {
    "PI_OFFLINE": "1",
    "PI_SKIP_VERSION_CHECK": "1",
    "PI_TELEMETRY": "0",
}
"""With these Pi makes no network call of its own (catalog refresh, version check, telemetry):
only the model calls, to the interception."""


class PiConfig(NpmAgentConfig):
    """Options of the pi harness (its node: Pi 1.x needs Node >= 22.19)."""

    version: str = "1.6.0"
    package: str = "@earendil-works/pi-coding-agent"
    """The npm package: ``@mariozechner/pi-coding-agent`` for versions before 0.74."""
    disabled_tools: tuple[str, ...] = ()
    """Tools Pi must not offer (``bash``, ``edit``…): passed as ``--exclude-tools``."""


def mcp_json(servers: dict[str, str]) -> str:
    """Pi's ``mcp.json``: the task's MCP servers (streamable HTTP), their tools declared to the
    model directly (``direct``; Pi's default hides them behind its code mode)."""
    entries = {name: {"url": url, "exposure": "direct"} for name, url in servers.items()}
    return json.dumps({"mcpServers": entries}, indent=2)


def models_json(model: str, base_url: str) -> str:
    """Pi's ``models.json``: one provider, the interception, serving ``model`` in the
    chat-completions dialect, its key read from the environment at request time."""
    provider = {
        "baseUrl": base_url,
        "api": "openai-completions",
        "apiKey": f"${KEY_VAR}",
        "models": [{"id": model, "reasoning": False, "input": ["text"]}],
    }
    return json.dumps({"providers": {PROVIDER: provider}}, indent=2)


def model_failure(events: str) -> str | None:
    """The error of the last assistant message in Pi's JSON event stream, when it ended in one
    (``stopReason: "error"``); None when it ended normally."""
    for line in reversed(events.split("\n")):  # not splitlines: Node leaves U+2028 raw
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if not isinstance(event, dict):
            continue
        message = event.get("message")
        if event.get("type") == "message_end" and isinstance(message, dict):
            if message.get("role") != "assistant":
                continue
            if message.get("stopReason") != "error":
                return None
            return f"pi: the model call failed: {str(message.get('errorMessage'))[:500]}"
    return None


class PiHarness(NpmAgentHarness):
    """Pi in print mode with its JSON event stream, project files ignored; its session file
    stays in its own dir in the box, so a later segment continues it (``--continue``)."""

    id = "pi"
    config_type: ClassVar[type[HarnessConfig]] = PiConfig
    config: PiConfig
    BINARY = "pi"
    EVENTS_PATH = EVENTS_PATH
    BOX_PATHS = ("PI_CODING_AGENT_DIR",)
    SKILLS_DIR = f"{PI_DIR}/skills"
    SUPPORTS_RESUME = True

    @property
    def package(self) -> str:
        return self.config.package

    async def write_config(self, ctx: LaunchContext, runtime: Runtime) -> None:
        await runtime.write(
            f"{PI_DIR}/models.json", models_json(ctx.model, openai_base_url(ctx.endpoint)).encode()
        )
        if ctx.mcp_servers:
            await runtime.write(f"{PI_DIR}/mcp.json", mcp_json(ctx.mcp_servers).encode())

    def arguments(self, ctx: LaunchContext, task: str, resumed: bool) -> list[str]:
        c = self.config
        return [
            "--print",
            "--mode",
            "json",
            # Its session file goes to its own dir in the box; a later segment continues it.
            *(["--continue"] if resumed else []),
            "--offline",
            # Project-local settings, extensions and MCP servers are the task's files, not ours.
            "--no-approve",
            "--provider",
            PROVIDER,
            "--model",
            ctx.model,
            *(["--exclude-tools", ",".join(c.disabled_tools)] if c.disabled_tools else []),
            # Named one by one: --no-approve leaves project skills out, and naming them does not
            # depend on where this Pi version discovers user skills.
            *(a for f in c.skills for a in ("--skill", f"{self.SKILLS_DIR}/{Path(f).name}")),
            *c.extra_args,
            "--",
            task,
        ]

    def environment(self, ctx: LaunchContext) -> dict[str, str]:
        return {"PI_CODING_AGENT_DIR": PI_DIR, KEY_VAR: ctx.secret, **OPT_OUTS}

    async def checked(self, runtime: Runtime, result: ProgramResult) -> ProgramResult:
        if not result.ok:
            return result
        # Pi's print mode exits 0 when its model call failed (a 401, a refused call): its last
        # assistant message says so, and the rollout must see a failed program.
        failure = model_failure((await runtime.read(EVENTS_PATH)).decode(errors="replace"))
        if failure is None:
            return result
        return result.model_copy(update={"exit_code": 1, "stderr": result.stderr + failure})
