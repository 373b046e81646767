"""The ``browser-use`` harness: the PyPI browser agent, in its own uv venv (bytecode compiled)
from the node's tool dir, driving a headless Chromium that its launcher program
(``programs/browser_use_agent.py``) starts inside the box, against the interception in the chat
dialect with browser-use's structured output. The box needs a Chromium on its ``PATH``
(Debian's ``chromium``); the agent's final answer is the rollout's last reply, and its summary
(answer, steps, visited URLs) is kept on the trace.
"""

from __future__ import annotations

from importlib import resources
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

PROGRAM_PATH = f"{AGENT_DIR}/browser_use_agent.py"
TASK_PATH = f"{AGENT_DIR}/browser-task.txt"
RESULT_PATH = f"{AGENT_DIR}/browser-use-result.json"
STATE_DIR = f"{AGENT_DIR}/browser"


class BrowserUseConfig(AgentHarnessConfig):
    """Options of the browser-use harness."""

    version: str = "0.13.14"
    max_steps: int = Field(20, gt=0)
    """browser-use's ``max_steps``: agent steps (one model call each) before it gives up."""
    chromium: str = "chromium"
    """The browser the box runs: a name on the box's ``PATH`` or an absolute path."""
    vision: bool = False
    """Send page screenshots to the model (browser-use's ``use_vision``)."""
    max_failures: int = Field(2, gt=0)
    """Consecutive failed steps (a bad reply, a refused call) before browser-use gives up."""


def program_source() -> bytes:
    return (resources.files("vfray.harnesses") / "programs" / "browser_use_agent.py").read_bytes()


class BrowserUseHarness(ProvisionedHarness):
    """browser-use: one browser action per model call, ends with its ``done`` action."""

    id = "browser-use"
    config_type: ClassVar[type[HarnessConfig]] = BrowserUseConfig
    config: BrowserUseConfig
    ARTIFACTS = (RESULT_PATH,)

    def tool_spec(self) -> ToolSpec:
        return ToolSpec(
            name="browser-use", kind="pypi", package="browser-use", version=self.config.version
        )

    async def setup(self, runtime: Runtime) -> None:
        await super().setup(runtime)
        await runtime.write(PROGRAM_PATH, program_source(), mode=0o644)

    def argv(self, python: str, model: str, endpoint: str) -> list[str]:
        c = self.config
        return [
            python,
            PROGRAM_PATH,
            "--task-file",
            TASK_PATH,
            "--model",
            model,
            "--base-url",
            openai_base_url(endpoint),
            "--state-dir",
            STATE_DIR,
            "--result",
            RESULT_PATH,
            "--chromium",
            c.chromium,
            "--max-steps",
            str(c.max_steps),
            "--max-failures",
            str(c.max_failures),
            *(["--vision"] if c.vision else []),
            *c.extra_args,
        ]

    def env(self, ctx: LaunchContext, path: str) -> dict[str, str]:
        return {
            "PATH": path,
            "HOME": f"{AGENT_DIR}/home",
            "OPENAI_API_KEY": ctx.secret,
            # Offline and quiet: no telemetry, no cloud sync, no extension downloads.
            "ANONYMIZED_TELEMETRY": "false",
            "BROWSER_USE_CLOUD_SYNC": "false",
            "BROWSER_USE_CONFIG_DIR": f"{AGENT_DIR}/browseruse-config",
            "BROWSER_USE_LOGGING_LEVEL": "warning",
            "PYTHONDONTWRITEBYTECODE": "1",
            **self.config.env,
        }

    async def launch(self, ctx: LaunchContext, runtime: Runtime) -> ProgramResult:
        tool = await self.box_tool(runtime)
        await runtime.write(TASK_PATH, prompt_text(self.resolve_prompt(ctx.data)).encode())
        argv = self.argv(tool.executable("python"), ctx.model, ctx.endpoint)
        return await self.run_logged(
            runtime,
            argv,
            self.env(ctx, tool.path_env()),
            stdout_path=f"{AGENT_DIR}/browser-use.log",
            timeout=ctx.timeout,
            box_paths=("HOME", "BROWSER_USE_CONFIG_DIR"),
        )
