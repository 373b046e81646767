"""The ``openhands`` harness: OpenHands' agent (PyPI ``openhands-sdk`` and ``openhands-tools``,
the SDK that OpenHands' app and CLI run on) headless in the box, through litellm against the
interception in the chat dialect, with its terminal and file-editor tools working in the box's
work dir, and a task's MCP servers (streamable HTTP) as the SDK's ``mcp_config``. vfray's program
``programs/openhands_agent.py`` builds the agent and runs one conversation; its events are kept on
the trace.

The SDK needs Python >= 3.12. Its venv is built on a Python 3.13 taken from Debian 13's packages
into the node's tool dir (:mod:`vfray.harnesses._debian_python`), never the image's. The full
``openhands-ai`` app runs its agent in a docker sandbox of its own, pulled from a registry, and
is not used.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field

from vfray.errors import ConfigError
from vfray.harnesses._debian_python import VERSION, ensure_python, interpreter_path
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
from vfray.runtimes.registry import runtime_class

PROGRAM_PATH = f"{AGENT_DIR}/openhands_agent.py"
TASK_PATH = f"{AGENT_DIR}/openhands-task.txt"
EVENTS_PATH = f"{AGENT_DIR}/openhands-events.jsonl"
LOG_PATH = f"{AGENT_DIR}/openhands.log"
HOME = f"{AGENT_DIR}/openhands-home"
ToolName = Literal["terminal", "file_editor", "task_tracker"]

OPT_OUTS = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # else litellm downloads its cost map at import
    "OPENHANDS_SUPPRESS_BANNER": "1",
    "LMNR_PROJECT_API_KEY": "",  # Laminar tracing stays off without a key
    "OTEL_SDK_DISABLED": "true",
    "PYTHONUNBUFFERED": "1",
}


class OpenHandsConfig(AgentHarnessConfig):
    """Options of the openhands harness."""

    version: str = "1.58.2"
    """``openhands-sdk`` and ``openhands-tools`` (released together)."""
    tools: tuple[ToolName, ...] = ("terminal", "file_editor")
    """The SDK tools the agent gets."""
    num_retries: int = Field(2, ge=0)
    """litellm's retries of a failed call (the SDK's default, 5 with up to 64 s waits, would
    keep a refused rollout's program alive until the stop grace ends it)."""


class OpenHandsHarness(ProvisionedHarness):
    """OpenHands' SDK agent, one conversation until it finishes (its ``finish`` tool)."""

    id = "openhands"
    config_type: ClassVar[type[HarnessConfig]] = OpenHandsConfig
    config: OpenHandsConfig
    ARTIFACTS = (EVENTS_PATH, LOG_PATH)
    SUPPORTS_MCP = True

    def tool_spec(self) -> ToolSpec:
        version = self.config.version
        return ToolSpec(
            name="openhands",
            kind="pypi",
            package="openhands-sdk",
            version=version,
            packages=(f"openhands-tools=={version}",),
            python=str(interpreter_path(Path(self.tools_root))),
        )

    def preflight(self, runtime_type: str) -> None:
        """Refuse up front a runtime whose image would lack the tool dir's interpreter (modal),
        and a node that lacks what unpacks the interpreter (``apt-get``, ``dpkg``)."""
        if runtime_class(runtime_type).TOOLS_IN_IMAGE:
            raise ConfigError(
                f"harness 'openhands' runs on a Python unpacked into the node's tool dir, which "
                f"runtime {runtime_type!r} does not mount; use bwrap, docker or subprocess"
            )
        if not interpreter_path(Path(self.tools_root)).is_file():
            missing = [p for p in ("apt-get", "dpkg") if shutil.which(p) is None]
            if missing:
                raise ConfigError(
                    f"harness 'openhands' unpacks Python {VERSION} from Debian's packages into "
                    f"{self.tools_root}, but this machine has no {', no '.join(missing)} on "
                    "PATH (a Debian node has them)"
                )
        super().preflight(runtime_type)

    async def setup(self, runtime: Runtime) -> None:
        if runtime.TOOLS_IN_IMAGE:
            self.preflight(runtime.type)
        await asyncio.to_thread(ensure_python, Path(self.tools_root))
        await super().setup(runtime)
        program = resources.files("vfray.harnesses") / "programs" / "openhands_agent.py"
        await runtime.write(PROGRAM_PATH, program.read_bytes(), mode=0o644)

    def argv(self, python: str, mcp_servers: Mapping[str, str] | None = None) -> list[str]:
        """The command line; ``mcp_servers`` (name -> URL in the box) become the agent's MCP
        servers, whose tools the SDK offers the model beside its own."""
        c = self.config
        return [
            # Started by the box's shell, not as a node program: the interpreter has a loader of
            # its own (Debian 13's), which the node's would replace in a box over an image.
            "/bin/sh",
            "-c",
            'exec "$@"',
            "openhands",
            python,
            PROGRAM_PATH,
            "--task-file",
            TASK_PATH,
            "--events",
            EVENTS_PATH,
            "--max-iterations",
            str(c.max_steps),
            "--tools",
            ",".join(c.tools),
            "--num-retries",
            str(c.num_retries),
            *(["--mcp", json.dumps(dict(mcp_servers))] if mcp_servers else []),
            *c.extra_args,
        ]

    def env(self, ctx: LaunchContext, path: str) -> dict[str, str]:
        return {
            "PATH": path,
            "HOME": HOME,
            "LLM_BASE_URL": openai_base_url(ctx.endpoint),
            "LLM_API_KEY": ctx.secret,
            "LLM_MODEL": ctx.model,
            **OPT_OUTS,
            **self.config.env,
        }

    async def launch(self, ctx: LaunchContext, runtime: Runtime) -> ProgramResult:
        tool = await self.box_tool(runtime)
        await runtime.write(TASK_PATH, prompt_text(self.resolve_prompt(ctx.data)).encode())
        return await self.run_logged(
            runtime,
            self.argv(tool.executable("python"), ctx.mcp_servers),
            self.env(ctx, tool.path_env()),
            stdout_path=LOG_PATH,
            timeout=ctx.timeout,
            box_paths=("HOME",),
        )
