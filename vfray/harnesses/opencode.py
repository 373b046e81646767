"""The ``opencode`` harness: opencode (npm ``opencode-ai``, whose install step links in its native
binary, so no Node.js at run time) run as ``opencode run --format json`` against the interception
through an OpenAI-compatible provider (``@ai-sdk/openai-compatible``, bundled in the binary) in
its own config file; its data, cache and config homes are in the box's agent dir, and its JSON
event stream is kept on the trace.
"""

from __future__ import annotations

import json
from typing import ClassVar

from vfray.harnesses._npm_harness import NpmAgentHarness
from vfray.harnesses.base import HarnessConfig, LaunchContext
from vfray.harnesses.chat import openai_base_url
from vfray.harnesses.provisioned import AGENT_DIR, AgentHarnessConfig
from vfray.runtimes.base import Runtime

HOME = f"{AGENT_DIR}/opencode-home"
CONFIG_PATH = f"{HOME}/opencode.json"
EVENTS_PATH = f"{AGENT_DIR}/opencode-events.jsonl"
KEY_VAR = "VFRAY_API_KEY"
PLUGIN_LOCK = json.dumps({"packages": {"": {"dependencies": {"@opencode-ai/plugin": "*"}}}})
"""Its global config dir's ``package-lock.json``: opencode npm-installs its plugin SDK (95 MB)
into each writable config dir at every start unless ``node_modules`` is there and the lock
names the package; a box has no registry, and a rollout needs no plugins."""
PROVIDER = "vfray"

OPT_OUTS = {
    "OPENCODE_DISABLE_MODELS_FETCH": "1",
    "OPENCODE_DISABLE_AUTOUPDATE": "1",
    "OPENCODE_DISABLE_SHARE": "1",
    "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
    "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
    # Nor the node's Claude Code prompts and skills (~/.claude): the box's task only.
    "OPENCODE_DISABLE_CLAUDE_CODE": "1",
}
"""With these the program connects only to the interception (no models.dev list, update
check, plugin or language-server install)."""


class OpencodeConfig(AgentHarnessConfig):
    """Options of the opencode harness."""

    version: str = "1.18.33"
    disabled_tools: tuple[str, ...] = ()
    """Tools the agent must not get, as opencode names them (``bash``, ``webfetch``, a task's
    MCP tool as ``SERVER_TOOL``): turned off in its config's ``tools``."""


def config_json(
    model: str,
    base_url: str,
    mcp_servers: dict[str, str] | None = None,
    disabled_tools: tuple[str, ...] = (),
    max_steps: int | None = None,
) -> dict[str, object]:
    """opencode's config: the interception as the only provider (its key read from
    ``$VFRAY_API_KEY``), no autoupdate or sharing, every permission granted (the box is the
    sandbox), and the task's MCP servers as remote ones."""
    config: dict[str, object] = {
        "model": f"{PROVIDER}/{model}",
        "autoupdate": False,
        "share": "disabled",
        "permission": {"edit": "allow", "bash": "allow", "webfetch": "allow"},
        "provider": {
            PROVIDER: {
                "npm": "@ai-sdk/openai-compatible",
                "name": PROVIDER,
                "options": {"baseURL": base_url, "apiKey": f"{{env:{KEY_VAR}}}"},
                "models": {model: {"name": model, "tool_call": True}},
            }
        },
    }
    if max_steps is not None:
        config["agent"] = {"build": {"steps": max_steps}}
    if disabled_tools:
        config["tools"] = {name: False for name in disabled_tools}
    if mcp_servers:
        config["mcp"] = {
            name: {"type": "remote", "url": url, "enabled": True}
            for name, url in mcp_servers.items()
        }
    return config


class OpencodeHarness(NpmAgentHarness):
    """opencode's non-interactive ``run``, every permission approved; a later segment continues
    the session it saved in its data home (``run --continue``)."""

    id = "opencode"
    config_type: ClassVar[type[HarnessConfig]] = OpencodeConfig
    config: OpencodeConfig
    PACKAGE = "opencode-ai"
    BINARY = "opencode"
    EVENTS_PATH = EVENTS_PATH
    BOX_PATHS = (
        "HOME",
        "XDG_CONFIG_HOME",
        "XDG_DATA_HOME",
        "XDG_CACHE_HOME",
        "XDG_STATE_HOME",
        "OPENCODE_CONFIG",
    )
    SKILLS_DIR = f"{HOME}/config/opencode/skills"
    SUPPORTS_RESUME = True

    async def write_config(self, ctx: LaunchContext, runtime: Runtime) -> None:
        c = self.config
        config = config_json(
            ctx.model, openai_base_url(ctx.endpoint), ctx.mcp_servers, c.disabled_tools, c.max_steps
        )
        await runtime.write(CONFIG_PATH, json.dumps(config).encode())
        await runtime.write(f"{HOME}/config/opencode/package-lock.json", PLUGIN_LOCK.encode())
        await runtime.write(f"{HOME}/config/opencode/node_modules/.keep", b"")

    def arguments(self, ctx: LaunchContext, task: str, resumed: bool) -> list[str]:
        return [
            "run",
            "--format",
            "json",
            "--model",
            f"{PROVIDER}/{ctx.model}",
            # A title of its own: otherwise a second model call writes one, recorded on the
            # trace beside the task's calls.
            "--title",
            "vfray rollout",
            # A later segment continues the session the last one left in its data home.
            *(["--continue"] if resumed else []),
            *self.config.extra_args,
            "--",
            # It joins its message words with spaces but quotes (and escapes) any word that
            # holds one: words without spaces join back into the exact text.
            *task.split(" "),
        ]

    def environment(self, ctx: LaunchContext) -> dict[str, str]:
        return {
            # Its database, caches and global config go to the box, never the node's home.
            "HOME": HOME,
            "XDG_CONFIG_HOME": f"{HOME}/config",
            "XDG_DATA_HOME": f"{HOME}/data",
            "XDG_CACHE_HOME": f"{HOME}/cache",
            "XDG_STATE_HOME": f"{HOME}/state",
            "OPENCODE_CONFIG": CONFIG_PATH,
            KEY_VAR: ctx.secret,
            **OPT_OUTS,
        }
