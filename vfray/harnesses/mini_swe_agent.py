"""The ``mini-swe-agent`` harness: the PyPI agent, in its own uv venv from the node's tool dir,
run non-interactively (``mini -y --exit-immediately``) against the interception in the chat
dialect through litellm; its trajectory file is kept on the trace.
"""

from __future__ import annotations

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

TRAJECTORY_PATH = f"{AGENT_DIR}/trajectory.json"


class MiniSweAgentConfig(AgentHarnessConfig):
    """Options of the mini-swe-agent harness."""

    version: str = "2.4.6"
    mini_config: str = "mini.yaml"
    """mini-swe-agent's base config (``mini.yaml``: a ``bash`` tool; ``mini_textbased.yaml``:
    commands in fenced blocks, with ``model_class="litellm_textbased"``)."""
    model_class: str | None = None
    """mini-swe-agent's ``--model-class`` (e.g. ``litellm_textbased``); None: its default."""
    command_timeout: float = Field(120.0, gt=0)
    """Seconds one shell command may run."""
    model_retries: int = Field(3, gt=0)
    """Attempts per model call (mini-swe-agent's default of 10 backs off for minutes)."""


class MiniSweAgentHarness(ProvisionedHarness):
    """mini-swe-agent: one shell command per step, ends with its submit command."""

    id = "mini-swe-agent"
    config_type: ClassVar[type[HarnessConfig]] = MiniSweAgentConfig
    config: MiniSweAgentConfig
    ARTIFACTS = (TRAJECTORY_PATH,)

    def tool_spec(self) -> ToolSpec:
        return ToolSpec(
            name="mini-swe-agent",
            kind="pypi",
            package="mini-swe-agent",
            version=self.config.version,
        )

    def argv(self, mini: str, task: str, model: str) -> list[str]:
        c = self.config
        return [
            mini,
            "-y",
            "--exit-immediately",
            "--agent-class",
            "default",
            "-c",
            c.mini_config,
            "-c",
            f"agent.step_limit={c.max_steps}",
            "-c",
            "agent.cost_limit=0",
            "-c",
            f"environment.timeout={int(c.command_timeout)}",
            *(["--model-class", c.model_class] if c.model_class else []),
            "-m",
            f"openai/{model}",
            "-o",
            TRAJECTORY_PATH,
            "-t",
            task,
            *c.extra_args,
        ]

    def env(self, ctx: LaunchContext, path: str) -> dict[str, str]:
        return {
            "PATH": path,
            "MSWEA_CONFIGURED": "true",  # skips the first-run setup wizard
            "MSWEA_SILENT_STARTUP": "1",
            "MSWEA_COST_TRACKING": "ignore_errors",  # the served model has no price
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # else litellm downloads a cost map
            "MSWEA_GLOBAL_CONFIG_DIR": f"{AGENT_DIR}/mini-config",
            "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": str(self.config.model_retries),
            "OPENAI_BASE_URL": openai_base_url(ctx.endpoint),
            "OPENAI_API_KEY": ctx.secret,
            **self.config.env,
        }

    async def launch(self, ctx: LaunchContext, runtime: Runtime) -> ProgramResult:
        tool = await self.box_tool(runtime)
        task = prompt_text(self.resolve_prompt(ctx.data))
        argv = self.argv(tool.executable("mini"), task, ctx.model)
        return await runtime.run_program(argv, self.env(ctx, tool.path_env()), timeout=ctx.timeout)
