"""A conformance harness: verifiers v1's own ``bash`` program, unchanged, run against vfray.

verifiers v1's default harness is a PEP 723 chat program (``CHAT_PROGRAM_SOURCE``: a streaming
chat-completions loop with ``bash`` and ``edit`` tools, compaction that reads the context window
from ``GET /v1/models``, and its own transport retries). This harness provisions the PyPI
``verifiers`` package into the node's tool dir, takes that program text from it as it ships, and
runs it with the flags verifiers' ``BashHarness`` passes, so a rollout checks the endpoint
contract vfray's interception offers against the program written for verifiers' own.

Internal: importable, but not the public API (:mod:`vfray`, :mod:`vfray.testing`,
:mod:`vfray.train`, :mod:`vfray.compat.v1`); names here may move.
"""

from __future__ import annotations

import shlex
from typing import ClassVar

from vfray.harnesses.base import HarnessConfig, LaunchContext
from vfray.harnesses.chat import openai_base_url
from vfray.harnesses.provisioned import AGENT_DIR, AgentHarnessConfig, ProvisionedHarness
from vfray.runtimes.base import ProgramResult, Runtime
from vfray.runtimes.provision import ToolSpec
from vfray.trace import Message

PROGRAM_PATH = f"{AGENT_DIR}/verifiers_chat_program.py"
_EXTRACT = (
    "import sys; from verifiers.v1.harnesses.utils.launch import CHAT_PROGRAM_SOURCE as s; "
    "from verifiers.v1.harnesses.bash.harness import BASH_SYSTEM_PROMPT as b, "
    "EDIT_SYSTEM_PROMPT as e; open(sys.argv[1], 'w').write(s); print(b + ' ' + e)"
)
"""Writes the program (as verifiers ships it) to a file; prints the system prompt its harness
gives the program (with the ``edit`` tool on, verifiers' default)."""


class VerifiersBashConfig(AgentHarnessConfig):
    """Options of the verifiers-bash conformance harness."""

    version: str = "0.4.0"
    """The ``verifiers`` release whose program runs."""
    compaction: bool = True
    """Pass ``--compaction`` (verifiers' default), which asks ``GET /v1/models`` first."""


class VerifiersBashHarness(ProvisionedHarness):
    """verifiers v1's bash chat program, unchanged (chat dialect, streaming, ``bash``/``edit``)."""

    id = "verifiers-bash"
    config_type: ClassVar[type[HarnessConfig]] = VerifiersBashConfig
    config: VerifiersBashConfig
    APPENDS_SYSTEM_PROMPT = True  # as verifiers' BashHarness: its own text, then the task's

    def tool_spec(self) -> ToolSpec:
        return ToolSpec(
            name="verifiers", kind="pypi", package="verifiers", version=self.config.version
        )

    async def launch(self, ctx: LaunchContext, runtime: Runtime) -> ProgramResult:
        tool = await self.box_tool(runtime)
        python = tool.executable("python")
        task_system, task = _split_prompt(self.resolve_prompt(ctx.data))
        flags = ["--bash", "--edit", *(["--compaction"] if self.config.compaction else [])]
        args = [
            f"--base-url={openai_base_url(ctx.endpoint)}",
            f"--api-key={ctx.secret}",
            f"--model={ctx.model}",
            *flags,
            f"--prompt={task}",
            *self.config.extra_args,
        ]
        # The harness's own system prompt is printed by the extraction step; the task's is
        # appended the way verifiers' BashHarness joins them.
        script = (
            f"mkdir -p {shlex.quote(AGENT_DIR)} && "
            f'system="$("$0" -c {shlex.quote(_EXTRACT)} {shlex.quote(PROGRAM_PATH)})" && '
            f'exec "$0" {shlex.quote(PROGRAM_PATH)} "--system-prompt=$system'
            f'{_shell_double_quoted(task_system)}" "$@"'
        )
        env = {"PATH": tool.path_env(), **self.config.env}
        argv = ["/bin/sh", "-c", script, python, *args]
        return await runtime.run_program(argv, env, timeout=ctx.timeout)


def _split_prompt(messages: list[dict[str, object]]) -> tuple[str, str]:
    """(the task's system text, the rest as one prompt), as verifiers resolves a text prompt."""
    parsed = [Message.model_validate(m) for m in messages]
    system = "\n\n".join(m.text for m in parsed if m.role == "system")
    return system, "\n\n".join(m.text for m in parsed if m.role != "system" and m.text)


def _shell_double_quoted(text: str) -> str:
    """``text`` (prefixed with the blank line verifiers joins prompts with) made safe inside a
    double-quoted shell word."""
    if not text:
        return ""
    escaped = "".join("\\" + c if c in '"\\$`' else c for c in text)
    return "\n\n" + escaped
