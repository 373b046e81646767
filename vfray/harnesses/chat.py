"""The shared base of the built-in ``null`` and ``bash`` harnesses: both run the same stdlib-only
program (``programs/chat_loop.py``) inside the box, and differ only in the tools it enables.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import uuid
from importlib import resources
from typing import Any, ClassVar
from urllib.parse import urlsplit

from pydantic import Field

from vfray.errors import SandboxError
from vfray.harnesses.base import PROGRAM_DIR, Harness, HarnessConfig, LaunchContext
from vfray.runtimes.base import ProgramResult, Runtime
from vfray.trace import Message

PROGRAM_PATH = f"{PROGRAM_DIR}/chat_loop.py"
TRANSCRIPT_PATH = f"{PROGRAM_DIR}/transcript.json"


def transcript_path(seat: str | None) -> str:
    """Where a rollout's transcript lives in its box: seats sharing one box each keep their
    own (a seat resuming after another used the box must not read the other's)."""
    if seat is None:
        return TRANSCRIPT_PATH
    # Seat names are free text: a safe file name, with a digest so two never collide.
    slug = re.sub(r"[^A-Za-z0-9_-]", "_", seat)[:40]
    digest = hashlib.sha256(seat.encode()).hexdigest()[:8]
    return f"{PROGRAM_DIR}/transcript-{slug}-{digest}.json"


class ChatLoopConfig(HarnessConfig):
    """Options of the chat-loop program."""

    max_steps: int = Field(50, gt=0)
    """Model calls per segment before the program gives up."""
    command_timeout: float = Field(120.0, gt=0)
    """Seconds one bash tool call may run before its process group is killed."""
    request_timeout: float = Field(600.0, gt=0)
    """Seconds one model call may take."""
    retries: int = Field(2, ge=0)
    """Retries of a model call answered 429/5xx or not answered at all."""
    python: str | None = None
    """The interpreter inside the box; None: the runtime's own (``Runtime.python``)."""
    disabled_tools: tuple[str, ...] = ()
    """Tools the model is not offered: the program's own (``bash``, ``edit``) or a task's MCP
    tool, by its name or as ``server__tool``. The chat loop (bash, null) and claude-code take
    this option; the other harnesses refuse it as an unknown option."""


@functools.cache
def program_source() -> bytes:
    """The chat-loop program, as shipped in the package (read once per process)."""
    return (resources.files("vfray.harnesses") / "programs" / "chat_loop.py").read_bytes()


def openai_base_url(endpoint: str) -> str:
    """``endpoint`` as an OpenAI-style base URL: a bare host gets ``/v1`` appended."""
    endpoint = endpoint.rstrip("/")
    return endpoint + "/v1" if urlsplit(endpoint).path in ("", "/") else endpoint


def parse_summary(result: ProgramResult) -> dict[str, Any] | None:
    """The JSON summary the program prints as its last stdout line, if it printed one:
    ``{"chat_loop": "completed"|"stopped"|"max_steps"|"error", "steps", "tool_calls",
    "final", ...}``."""
    for line in reversed(result.stdout.strip().splitlines()):
        try:
            summary = json.loads(line)
        except ValueError:
            continue
        if isinstance(summary, dict) and "chat_loop" in summary:
            return summary
    return None


class ChatLoopHarness(Harness):
    """Runs ``programs/chat_loop.py`` in the box with the tools named in ``TOOLS``."""

    TOOLS: ClassVar[tuple[str, ...]] = ()
    config_type = ChatLoopConfig
    config: ChatLoopConfig

    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_MCP = True
    SUPPORTS_RESUME = True
    NEEDS_CONTAINER = False

    def program_files(self) -> dict[str, bytes]:
        return {PROGRAM_PATH: program_source()}

    def argv(
        self,
        prompt_path: str,
        python: str = "python3",
        mcp: dict[str, str] | None = None,
        transcript: str = TRANSCRIPT_PATH,
    ) -> list[str]:
        """The program's command line for one segment."""
        c = self.config
        servers = [f"--mcp={name}={url}" for name, url in (mcp or {}).items()]
        return [
            c.python or python,
            # Isolated and without site: the program is stdlib-only, and scanning a big
            # site-packages (its .pth files) was ~10% of each launch's CPU here.
            "-I",
            "-S",
            PROGRAM_PATH,
            "--messages",
            prompt_path,
            "--transcript",
            transcript,
            "--tools",
            ",".join(self.TOOLS),
            "--max-steps",
            str(c.max_steps),
            "--command-timeout",
            f"{c.command_timeout:g}",
            "--max-output-chars",
            str(c.max_tool_output_chars),
            "--request-timeout",
            f"{c.request_timeout:g}",
            "--retries",
            str(c.retries),
            *([f"--disable={','.join(c.disabled_tools)}"] if c.disabled_tools else []),
            *self.program_flags(),
            *servers,
            *c.extra_args,
        ]

    def program_flags(self) -> list[str]:
        """Flags a variant of the loop adds to its command line (``compact``, ``rlm``)."""
        return []

    def env(self, ctx: LaunchContext) -> dict[str, str]:
        """The program's environment, without the rollout secret (see :meth:`launch`)."""
        return {
            **self.config.env,
            "VFRAY_BASE_URL": openai_base_url(ctx.endpoint),
            "VFRAY_MODEL": ctx.model,
        }

    async def launch(self, ctx: LaunchContext, runtime: Runtime) -> ProgramResult:
        # A fresh name per segment, so a resumed segment never reads a stale prompt.
        prompt_path = f"{PROGRAM_DIR}/prompt-{uuid.uuid4().hex[:12]}.json"
        prompt = json.dumps(self.resolve_prompt(ctx.data), ensure_ascii=False)
        await runtime.write(prompt_path, prompt.encode())
        argv = self.argv(prompt_path, runtime.python, ctx.mcp_servers, transcript_path(ctx.seat))
        # The secret goes in a file the program deletes once read, not in the environment: the
        # bash tool's commands run as the program's user and could read the environment of
        # every process of the box that holds it (the program's, the box's forwarder's).
        key_path = f"{PROGRAM_DIR}/key-{uuid.uuid4().hex[:12]}"
        await runtime.write(key_path, ctx.secret.encode(), mode=0o600)
        env = {**self.env(ctx), "VFRAY_API_KEY_FILE": key_path}
        # The program signals once its interpreter is up: a throttled runtime starts the next
        # launch then (vfray.runtimes.launches).
        return await runtime.run_program(argv, env, timeout=ctx.timeout, signals_ready=True)

    async def read_transcript(
        self, runtime: Runtime, ctx: LaunchContext | None = None
    ) -> list[Message] | None:
        path = transcript_path(None if ctx is None else ctx.seat)
        try:
            raw = json.loads(await runtime.read(path))
        except (OSError, ValueError, SandboxError):
            return None
        if not isinstance(raw, list):
            return None
        return [Message.model_validate(m) for m in raw if isinstance(m, dict)]
