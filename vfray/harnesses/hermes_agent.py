"""The ``hermes-agent`` harness: Nous Research's Hermes Agent (PyPI ``hermes-agent``), in its own
uv venv from the node's tool dir, run as one non-interactive query (``hermes chat -q``) in the
chat dialect against the interception as its ``custom`` provider; its session file is kept on
the trace.
"""

from __future__ import annotations

import json
import time
from typing import ClassVar

from pydantic import Field

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

HERMES_HOME = f"{AGENT_DIR}/hermes-home"
OUTPUT_PATH = f"{AGENT_DIR}/hermes-output.txt"


class HermesAgentConfig(AgentHarnessConfig):
    """Options of the hermes-agent harness."""

    version: str = "0.19.0"
    toolsets: tuple[str, ...] = ("terminal", "file")
    """Hermes toolsets the agent gets (``-t``): its shell and file tools; web, browser and the
    like would reach out of the box."""
    context_length: int = Field(131072, gt=0)
    """The model's context window as Hermes is told it: without one it asks openrouter.ai."""
    mcp_timeout: float = Field(60.0, gt=0)
    """Seconds Hermes waits at start for the task's MCP servers to list their tools (its
    ``mcp_discovery_timeout``, 1.5 s by default: on a loaded node the tools missed it)."""


OPT_OUTS = {"TIRITH_ENABLED": "false"}
"""Hermes would download its tirith command scanner from github.com at start."""


def config_yaml(
    model: str,
    base_url: str,
    key: str,
    config: HermesAgentConfig,
    mcp_servers: dict[str, str] | None = None,
) -> str:
    """Hermes's ``config.yaml`` (as JSON, which YAML reads): the interception as the ``custom``
    provider with the rollout's key. Hermes reads a custom endpoint's URL and key only from its
    config (it ignores ``OPENAI_BASE_URL`` and, for a loopback URL, ``OPENAI_API_KEY``), and
    asks openrouter.ai for a context window the config does not give. The task's MCP servers
    (streamable HTTP) go under ``mcp_servers``."""
    model_entry = {
        "provider": "custom",
        "base_url": base_url,
        "api_key": key,
        "default": model,
        "context_length": config.context_length,
    }
    servers = {name: {"url": url} for name, url in (mcp_servers or {}).items()}
    document = {"model": model_entry, "agent": {"max_turns": config.max_steps}}
    if servers:
        document |= {"mcp_servers": servers, "mcp_discovery_timeout": config.mcp_timeout}
    return json.dumps(document, indent=1)


def update_check(version: str) -> str:
    """A fresh answer in Hermes's update-check cache (``$HERMES_HOME/.update_check``, trusted
    for 6 hours): up to date. Without it every start asks pypi.org in the background."""
    return json.dumps({"ts": time.time(), "rev": None, "ver": version, "behind": 0})


class HermesAgentHarness(ProvisionedHarness):
    """Hermes Agent, one query in quiet mode, approvals off (the box is the sandbox)."""

    id = "hermes-agent"
    config_type: ClassVar[type[HarnessConfig]] = HermesAgentConfig
    config: HermesAgentConfig
    ARTIFACTS = (OUTPUT_PATH,)
    SUPPORTS_MCP = True
    SUPPORTS_SKILLS = True
    SKILLS_DIR = f"{HERMES_HOME}/skills"

    def tool_spec(self) -> ToolSpec:
        version = self.config.version
        return ToolSpec(
            name="hermes-agent",
            kind="pypi",
            package="hermes-agent",
            version=version,
            # Its MCP client (the ``mcp`` extra's pins), for a task's MCP servers.
            packages=(f"hermes-agent[mcp]=={version}",),
        )

    def argv(self, hermes: str, task: str, model: str, mcp: tuple[str, ...] = ()) -> list[str]:
        """The command line; ``mcp`` names the task's MCP servers, whose toolsets (one per
        server, under its name) are offered beside ``toolsets``. With ``skills`` the ``skills``
        toolset is added too: Hermes lists its skills to the model only beside those tools."""
        c = self.config
        return [
            hermes,
            "chat",
            "-q",
            task,
            "-Q",
            "--yolo",
            "--provider",
            "custom",
            "-m",
            model,
            "-t",
            ",".join((*c.toolsets, *(["skills"] if c.skills else []), *mcp)),
            "--max-turns",
            str(c.max_steps),
            "--ignore-rules",
            "--source",
            "tool",
            *c.extra_args,
        ]

    def env(self, path: str) -> dict[str, str]:
        return {
            "PATH": path,
            "HOME": HERMES_HOME,
            "HERMES_HOME": HERMES_HOME,
            **OPT_OUTS,
            **self.config.env,
        }

    async def launch(self, ctx: LaunchContext, runtime: Runtime) -> ProgramResult:
        tool = await self.box_tool(runtime)
        yaml = config_yaml(
            ctx.model, openai_base_url(ctx.endpoint), ctx.secret, self.config, ctx.mcp_servers
        )
        await runtime.write(f"{HERMES_HOME}/config.yaml", yaml.encode())
        await runtime.write(
            f"{HERMES_HOME}/.update_check", update_check(self.config.version).encode()
        )
        task = prompt_text(self.resolve_prompt(ctx.data))
        argv = self.argv(tool.executable("hermes"), task, ctx.model, tuple(ctx.mcp_servers))
        return await self.run_logged(
            runtime,
            argv,
            self.env(tool.path_env()),
            stdout_path=OUTPUT_PATH,
            timeout=ctx.timeout,
            box_paths=("HOME", "HERMES_HOME"),
        )
