"""The ``aider`` harness: Aider (PyPI ``aider-chat``), in its own uv venv from the node's tool dir,
run on one message (``aider --message TASK --yes-always``) in the chat dialect through litellm
against the interception. Aider edits files through the edit blocks of its replies (its own text
formats), not a shell tool; its chat history file is kept on the trace. Aider exits 0 when it
gave up on a model call (an unknown key, a refused call, its retries spent): the error it ended
on, read from that file, makes the program count as failed.
"""

from __future__ import annotations

import json
import re
from typing import ClassVar

from pydantic import Field

from vfray.errors import SandboxError
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

AIDER_HOME = f"{AGENT_DIR}/aider-home"
HISTORY_PATH = f"{AGENT_DIR}/aider.chat.history.md"
OUTPUT_PATH = f"{AGENT_DIR}/aider-output.txt"
METADATA_PATH = f"{AIDER_HOME}/model-metadata.json"

OPT_OUTS = (
    "--analytics-disable",
    "--no-check-update",
    "--no-show-release-notes",
    "--no-show-model-warnings",  # an unknown model's warning offers to open a web page
    "--no-detect-urls",  # a URL in the task would be fetched
    "--no-browser",
    "--no-notifications",
    "--no-fancy-input",
    "--no-pretty",
)
"""Aider's flags for a run with no terminal and no connection but the interception."""
OPT_OUT_ENV = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # else litellm downloads its cost map at import
    "AIDER_ANALYTICS": "false",
}


MODEL_ERROR = re.compile(r"litellm\.\w+Error: ")
"""How Aider reports a failed model call (``litellm.AuthenticationError: ...``)."""


def model_failure(history: str) -> str | None:
    """The model call error Aider gave up on: the last ``litellm.<Name>Error`` line of its chat
    history when no ``Retrying in ...`` follows it (a retried call may still succeed)."""
    failure = None
    for line in history.splitlines():
        text = line.removeprefix(">").strip()
        if MODEL_ERROR.match(text):
            failure = text
        elif text.startswith("Retrying in "):
            failure = None
    return failure


class AiderConfig(AgentHarnessConfig):
    """Options of the aider harness."""

    version: str = "0.86.2"
    edit_format: str | None = None
    """Aider's ``--edit-format`` (``whole``, ``diff``, ``udiff``...); None: its choice for the
    model (``whole`` for a model it does not know)."""
    git: bool = False
    """Let Aider use the work dir's git repo (never auto-committing: the task's scorer reads the
    tree as the agent left it). False: ``--no-git`` (Aider would otherwise offer to create a
    repo, which ``--yes-always`` accepts)."""
    map_tokens: int = 0
    """``--map-tokens``: the repo map's budget (0: none; the map needs git)."""
    context_length: int = Field(131072, gt=0)
    """The model's context window as Aider is told it (``--model-metadata-file``): without an
    entry for the model it downloads litellm's model list from raw.githubusercontent.com."""


def model_metadata(model: str, context_length: int) -> str:
    """Aider's model metadata (litellm's format) for the served model, at no cost."""
    entry = {
        "max_input_tokens": context_length,
        "max_tokens": context_length,
        "max_output_tokens": context_length,
        "input_cost_per_token": 0.0,
        "output_cost_per_token": 0.0,
        "litellm_provider": "openai",
        "mode": "chat",
    }
    return json.dumps({f"openai/{model}": entry})


class AiderHarness(ProvisionedHarness):
    """Aider, one message, every question answered yes, no commits."""

    id = "aider"
    config_type: ClassVar[type[HarnessConfig]] = AiderConfig
    config: AiderConfig
    ARTIFACTS = (HISTORY_PATH, OUTPUT_PATH)

    def tool_spec(self) -> ToolSpec:
        return ToolSpec(
            name="aider", kind="pypi", package="aider-chat", version=self.config.version
        )

    def argv(self, aider: str, task: str, model: str) -> list[str]:
        c = self.config
        return [
            aider,
            "--message",
            task,
            "--yes-always",
            "--model",
            f"openai/{model}",
            *(["--edit-format", c.edit_format] if c.edit_format else []),
            "--git" if c.git else "--no-git",
            "--no-auto-commits",
            "--no-dirty-commits",
            "--map-tokens",
            str(c.map_tokens),
            "--chat-history-file",
            HISTORY_PATH,
            "--input-history-file",
            f"{AIDER_HOME}/input.history",
            "--model-metadata-file",
            METADATA_PATH,
            *OPT_OUTS,
            *c.extra_args,
        ]

    def env(self, ctx: LaunchContext, path: str) -> dict[str, str]:
        base = openai_base_url(ctx.endpoint)
        return {
            "PATH": path,
            "HOME": AIDER_HOME,
            "OPENAI_API_BASE": base,
            "OPENAI_BASE_URL": base,
            "OPENAI_API_KEY": ctx.secret,
            **OPT_OUT_ENV,
            **self.config.env,
        }

    async def launch(self, ctx: LaunchContext, runtime: Runtime) -> ProgramResult:
        tool = await self.box_tool(runtime)
        metadata = model_metadata(ctx.model, self.config.context_length)
        await runtime.write(METADATA_PATH, metadata.encode())
        task = prompt_text(self.resolve_prompt(ctx.data))
        result = await self.run_logged(
            runtime,
            self.argv(tool.executable("aider"), task, ctx.model),
            self.env(ctx, tool.path_env()),
            stdout_path=OUTPUT_PATH,
            timeout=ctx.timeout,
            box_paths=("HOME",),
        )
        if not result.ok:
            return result
        try:
            history = (await runtime.read(HISTORY_PATH)).decode("utf-8", errors="replace")
        except (SandboxError, OSError):
            return result  # no history: it never got to the model
        failure = model_failure(history)
        if failure is None:
            return result
        # Exit 0 after giving up on the model: the rollout must see a failed program (a
        # refusal after a limit stop still ends cleanly: the stop is checked first).
        stderr = f"{result.stderr}aider: the model call failed: {failure[:500]}"
        return result.model_copy(update={"exit_code": 1, "stderr": stderr})
