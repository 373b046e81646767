"""The :class:`Harness` contract: a real agent program launched in a runtime box.

A harness talks to the model only through the interception endpoint, with the rollout's secret
as its API key. Its capability flags let the environment refuse impossible pairings at config
time (:func:`check_compatibility`), and :func:`classify_exit` turns a finished program into a
typed rollout error or a clean end.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import difflib
import os
import signal
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from vfray.errors import (
    ConfigError,
    HarnessError,
    IncompatibleError,
    PhaseTimeoutError,
    RolloutError,
    SandboxError,
)
from vfray.runtimes.base import ProgramResult, Runtime
from vfray.runtimes.images import refuse_image, runs_images
from vfray.runtimes.processes import is_secret
from vfray.task import TaskData
from vfray.trace import AgentArtifact, ErrorInfo, Message, Trace
from vfray.trace.messages import UserContent

if TYPE_CHECKING:
    from vfray.runtimes.provision import ToolSpec

STDERR_TAIL_CHARS = 2000
"""How much of a crashed program's output a :class:`HarnessError` carries."""
STOP_POLL = 0.5
"""Seconds between looks at whether the rollout was stopped while its program runs."""
INTERRUPT_RETRY = 0.1
"""Seconds between SIGTERMs to a stopped rollout's program that is not running yet."""


class HarnessConfig(BaseModel):
    """Options every harness understands; subclasses add their own fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_tool_output_chars: int = Field(16384, gt=0)
    """Tool output longer than this is cut in the middle (head and tail kept)."""
    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment variables for the program (the host's own are never forwarded)."""
    extra_args: tuple[str, ...] = ()
    """Extra command-line arguments appended to the program's argv."""
    skills: tuple[str, ...] = ()
    """Skill folders on the host (each holds a ``SKILL.md``) installed into the agent's own
    skill folder in the box, executable bits kept; only a harness with ``SUPPORTS_SKILLS``
    (``SKILL_HARNESSES``) takes them."""
    forward_env: tuple[str, ...] = ()
    """Names of host environment variables passed on to the program (read where the box's host
    builds the harness; one that is unset there is left out; ``env`` wins over one). Never a
    credential: a name that looks like one (``*API_KEY*``, ``*TOKEN*``, ``AWS_*``...: the box's
    secret filter) or the model's key variable is refused."""

    @field_validator("forward_env")
    @classmethod
    def _no_secrets(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        secret = [n for n in names if is_secret(n)]
        if secret:
            raise ValueError(
                f"{', '.join(secret)} look like credentials, which vfray never hands a box; "
                "pass a value in 'env' if the agent truly needs it"
            )
        return names

    def forwarded(self) -> dict[str, str]:
        """``forward_env``'s variables as this process's environment has them."""
        return {n: os.environ[n] for n in self.forward_env if n in os.environ}


class LaunchContext(BaseModel):
    """Everything one segment of the program needs; built by the rollout per segment."""

    model_config = ConfigDict(frozen=True)

    endpoint: str
    """The interception's OpenAI-style base URL as seen from inside the box."""
    secret: str
    """The rollout's bearer secret, given to the program as its API key."""
    model: str
    data: TaskData
    timeout: float | None = None
    """Seconds this segment may run (what is left of the agent budget)."""
    mcp_servers: dict[str, str] = {}
    """The task's MCP tool servers: name -> streamable-HTTP URL as seen from inside the box."""
    seat: str | None = None
    """The seat the rollout plays in a multi-agent episode: seats can share one box, so a
    harness keeps its per-rollout files there (a transcript) apart by it."""


PROGRAM_DIR = ".vfray"
"""vfray's folder in the box's work dir: the harnesses' programs, prompts, transcripts and agent
homes (``.vfray/agent``)."""
GIT_IGNORE_PATH = f"{PROGRAM_DIR}/.gitignore"
"""``*`` here keeps :data:`PROGRAM_DIR` out of any git repo a task has in its work dir: vfray's
files are not the agent's work, so neither ``git status`` nor an agent's ``git add -A`` (the
patch mini-swe-agent's SWE-bench config submits) sees them. Git reads a folder's own
``.gitignore``; no repo's files or settings are touched."""


SKILL_HARNESSES = (
    "claude-code",
    "claude-code-acp",
    "codex",
    "codex-acp",
    "gemini-cli",
    "hermes-agent",
    "kimi-code",
    "openclaw",
    "opencode",
    "pi",
    "qwen-code",
    "terminus-2",
)
"""The built-in harnesses with ``SUPPORTS_SKILLS``, named in the refusal (the registry imports
this module, so it cannot be asked here; tests/test_agent_skills.py keeps the two equal)."""


class Harness(abc.ABC):
    """Base of every harness. Subclasses set ``id`` and the flags, and implement :meth:`launch`.

    One instance serves many rollouts at once, so it keeps no per-rollout state: everything a
    segment needs arrives in its :class:`LaunchContext` and runtime.
    """

    id: ClassVar[str]
    config_type: ClassVar[type[HarnessConfig]] = HarnessConfig

    APPENDS_SYSTEM_PROMPT: ClassVar[bool] = False
    """The program sends the task's system prompt as a system message; when False it is folded
    into the first user message."""
    SUPPORTS_MCP: ClassVar[bool] = False
    """The program can use tools a taskset serves over MCP."""
    SUPPORTS_RESUME: ClassVar[bool] = False
    """The program can run later segments: relaunched on the conversation so far, or (a
    live-session harness) sent the next user message in its running session."""
    EXECUTES_CODE: ClassVar[bool] = True
    """The program runs model-written code in the box (the subprocess runtime warns)."""
    NEEDS_CONTAINER: ClassVar[bool] = True
    """The program needs a container image (refused on non-container runtimes)."""
    SUPPORTS_SKILLS: ClassVar[bool] = False
    """The program discovers agent skills (``SKILL.md`` folders): the ``skills`` option is
    installed where it looks (:attr:`SKILLS_DIR`); other harnesses refuse the option."""
    SKILLS_DIR: ClassVar[str | None] = None
    """Where the program discovers skills, relative to the box's work dir; set by the harnesses
    with ``SUPPORTS_SKILLS``."""

    @classmethod
    def agent_files(cls) -> frozenset[str]:
        """Names of the file sets the program keeps in the box's one fixed agent folder
        (``.vfray/agent``: its home, config, transcript), each named by the program that owns
        it; none by default. Two rollouts of one box whose harnesses share a name overwrite
        each other's files (and a resume can pick up the other's session), so seating refuses
        them (:func:`vfray.run.seat_refusals.shared_box_conflict`)."""
        return frozenset()

    def __init__(self, config: HarnessConfig | Mapping[str, Any] | None = None) -> None:
        self.config = self.parse_config(config)
        if self.config.skills and not self.SUPPORTS_SKILLS:
            raise ConfigError(
                f"harness {self.id!r} cannot load skills (no SUPPORTS_SKILLS); "
                f"use one of {', '.join(SKILL_HARNESSES)}"
            )
        forwarded = self.config.forwarded()
        if forwarded:
            # Into ``env``, which every harness hands its program.
            env = {**forwarded, **self.config.env}
            self.config = self.config.model_copy(update={"env": env})

    @classmethod
    def parse_config(cls, config: HarnessConfig | Mapping[str, Any] | None) -> HarnessConfig:
        """Validate ``config`` into this harness's ``config_type`` (ConfigError when invalid)."""
        if isinstance(config, cls.config_type):
            return config
        raw = config.model_dump() if isinstance(config, HarnessConfig) else dict(config or {})
        try:
            return cls.config_type.model_validate(raw)
        except ValidationError as exc:
            raise ConfigError(option_errors(cls.id, cls.config_type, exc)) from None

    # -- the contract --------------------------------------------------------------------------

    def preflight(self, runtime_type: str) -> None:
        """At run start, on a machine that runs boxes: refuse in one line (ConfigError) what
        every rollout on ``runtime_type`` would fail on here (a program the harness needs to
        install its agent). The default needs nothing."""
        return None

    def program_files(self) -> dict[str, bytes]:
        """Files :meth:`setup` uploads into the box (path relative to its work dir → bytes)."""
        return {}

    def box_tools(self) -> tuple[ToolSpec, ...]:
        """The agent programs this harness runs from the node's tool dir (none by default);
        the rollout names them to the runtime before the box starts (:meth:`Runtime.plan_tools`)."""
        return ()

    async def install_skills(self, runtime: Runtime) -> None:
        """Copy each ``skills`` folder into :attr:`SKILLS_DIR` under its own name, every file
        with its executable bits (a skill's scripts are run by the agent)."""
        if not self.config.skills or self.SKILLS_DIR is None:
            return
        for folder in self.config.skills:
            root = Path(folder).expanduser()
            if not (root / "SKILL.md").is_file():
                raise HarnessError(f"skill folder {folder} has no SKILL.md")
            for path in sorted(root.rglob("*")):
                if path.is_file():
                    mode = 0o755 if path.stat().st_mode & 0o111 else 0o644
                    target = f"{self.SKILLS_DIR}/{root.name}/{path.relative_to(root).as_posix()}"
                    await runtime.write(target, path.read_bytes(), mode=mode)

    async def setup(self, runtime: Runtime) -> None:
        """Install the program into the box. The default uploads :meth:`program_files`."""
        for path, content in self.program_files().items():
            await runtime.write(path, content, mode=0o755)

    @abc.abstractmethod
    async def launch(self, ctx: LaunchContext, runtime: Runtime) -> ProgramResult:
        """Run the program's first segment on ``ctx.data``'s prompt and wait for it to exit."""

    async def resume(
        self, ctx: LaunchContext, runtime: Runtime, messages: Sequence[Message]
    ) -> ProgramResult:
        """Run a later segment on ``messages``: the conversation so far plus the new user turn.

        The default relaunches the program with ``messages`` as its prompt.
        """
        if not self.SUPPORTS_RESUME:
            raise HarnessError(f"harness {self.id!r} cannot resume a conversation")
        return await self.launch(with_conversation(ctx, messages), runtime)

    def open_session(
        self, runtime: Runtime, history: Callable[[], Sequence[Message]]
    ) -> AgentSession:
        """The object that runs this rollout's segments. The default launches the program and
        relaunches it per resume (``history`` gives the recorded conversation when the program
        leaves no transcript); a live-session harness returns one that keeps its process."""
        return AgentSession(self, runtime, history)

    async def read_transcript(
        self, runtime: Runtime, ctx: LaunchContext | None = None
    ) -> list[Message] | None:
        """The conversation the last segment of ``ctx``'s rollout left in the box, when the
        program writes one."""
        return None

    async def score(self, trace: Trace, runtime: Runtime) -> Mapping[str, float | None]:
        """Metrics the harness adds once the task has scored (the scoring phase; the box is
        still up): name -> value, put on ``trace.metrics`` beside the task's (a name the task
        already set is left as the task set it). A failure is a note, never the rollout's
        error. The default adds none."""
        return {}

    async def cleanup(self, runtime: Runtime) -> None:
        """Undo what the harness left outside the box for this rollout (the teardown phase,
        before the box stops; always called, after a failure too). A failure is a note. The
        default has nothing to clean."""
        return None

    async def collect_artifacts(self, runtime: Runtime) -> list[AgentArtifact]:
        """Files to keep on the trace once the program has ended (the box is still up); the
        default keeps none. Failures here are notes, never errors of the rollout."""
        return []

    def resolve_prompt(self, data: TaskData) -> list[dict[str, Any]]:
        """The task's prompt as chat messages for this harness, with the system prompt placed
        as the harness expects (its own message, or folded into the first user message)."""
        messages = [m.model_dump(exclude_none=True) for m in data.prompt_messages]
        if self.APPENDS_SYSTEM_PROMPT:
            return messages
        system = "\n\n".join(
            Message.model_validate(m).text for m in messages if m["role"] == "system"
        )
        rest = [m for m in messages if m["role"] != "system"]
        if not system:
            return rest
        for i, message in enumerate(rest):
            if message["role"] == "user":
                rest[i] = {**message, "content": _prepend_text(system, message.get("content"))}
                return rest
        return [{"role": "user", "content": system}, *rest]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(id={self.id!r})"


def option_errors(harness_id: str, config_type: type[BaseModel], exc: ValidationError) -> str:
    """One line for a harness's invalid options: each unknown one with the closest known name,
    each bad value with pydantic's reason (not its several lines per error)."""
    known = sorted(config_type.model_fields)
    problems = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"]) or "options"
        if error["type"] == "extra_forbidden":
            close = difflib.get_close_matches(str(error["loc"][0]), known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append(f"unknown option {where!r}{hint}")
        else:
            problems.append(f"{where}: {error['msg']}")
    listed = f"; its options: {', '.join(known)}" if any("unknown" in p for p in problems) else ""
    return f"invalid config for harness {harness_id!r}: {'; '.join(problems)}{listed}"


def _prepend_text(text: str, content: Any) -> Any:
    if isinstance(content, list):
        return [{"type": "text", "text": text}, *content]
    if not content:
        return text
    return f"{text}\n\n{content}"


def with_conversation(ctx: LaunchContext, messages: Sequence[Message]) -> LaunchContext:
    """A context whose task prompt is ``messages`` (already placed, so no system prompt)."""
    prompt = [m.model_dump(exclude_none=True) for m in messages]
    data = ctx.data.model_copy(update={"prompt": prompt, "system_prompt": None})
    return ctx.model_copy(update={"data": data})


def check_compatibility(
    harness: type[Harness] | Harness,
    runtime: type[Runtime] | Runtime,
    taskset_has_tools: bool = False,
    *,
    has_user: bool = False,
    needs_image: bool = False,
    image_runtimes: Sequence[str] = (),
    resumable: Sequence[str] = (),
) -> None:
    """Refuse a harness, runtime and taskset pairing that cannot work, naming every reason
    (``image_runtimes``: the runtimes to name when the tasks have images this one cannot run;
    ``resumable``: the harnesses to name when the tasks continue and this one cannot resume).

    Raises :class:`IncompatibleError`; returns None when the pairing is fine.
    """
    h = harness if isinstance(harness, type) else type(harness)
    r = runtime if isinstance(runtime, type) else type(runtime)
    name, rtype = getattr(h, "id", h.__name__), getattr(r, "type", r.__name__)
    problems: list[str] = []
    if h.NEEDS_CONTAINER and not r.is_container:
        problems.append(
            f"harness {name!r} needs a container but runtime {rtype!r} is not one; "
            "use a container runtime such as 'docker' or 'modal'"
        )
    if needs_image and not runs_images(r):
        problems.append(refuse_image(rtype, image_runtimes))
    if taskset_has_tools and not h.SUPPORTS_MCP:
        problems.append(
            f"the taskset serves tools but harness {name!r} cannot use MCP tools; "
            "pick a harness with SUPPORTS_MCP"
        )
    if has_user and not h.SUPPORTS_RESUME:
        names = ", ".join(repr(n) for n in resumable) or "'bash' or 'null'"
        problems.append(
            f"the taskset has a user who speaks more than once (a user or next_message) but "
            f"harness {name!r} cannot resume a conversation; pick one that can: {names}"
        )
    if problems:
        raise IncompatibleError("; ".join(problems))


def output_tail(result: ProgramResult, limit: int = STDERR_TAIL_CHARS) -> str:
    """The last ``limit`` characters of stderr, or of stdout when stderr is empty."""
    text = result.stderr.strip() or result.stdout.strip()
    return text[-limit:]


def _describe_exit(code: int) -> str:
    if code == -signal.SIGKILL:
        return KILLED_BY_SIGKILL
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


KILLED_BY_SIGKILL = "killed by SIGKILL"


def killed_from_outside(error: ErrorInfo) -> bool:
    """The error is a harness program's (or its box's) death by a SIGKILL vfray did not send:
    vfray's own kills end a rollout as a timeout, a limit or a cancel, never as these."""
    return error.type in ("HarnessError", "SandboxError") and (
        f"({KILLED_BY_SIGKILL})" in error.message
    )


def classify_exit(
    result: ProgramResult, runtime_alive: bool, stopped_by_limit: bool
) -> RolloutError | None:
    """The typed error a finished harness program means, or None for a clean end.

    Once a limit stopped the rollout any exit is clean (the program's refused call usually
    makes it fail). Otherwise a timeout is a :class:`PhaseTimeoutError`, and a non-zero exit is
    a :class:`SandboxError` when the box died under it, else a :class:`HarnessError` carrying
    the tail of its stderr.
    """
    if stopped_by_limit:
        return None
    if result.timed_out:
        return PhaseTimeoutError(
            f"the harness program ran past its timeout ({result.duration:.1f}s)"
        )
    if result.exit_code == 0:
        return None
    how = _describe_exit(result.exit_code)
    if not runtime_alive:
        return SandboxError(f"the box died under the harness program ({how})")
    tail = output_tail(result)
    return HarnessError(f"the harness program failed ({how})" + (f":\n{tail}" if tail else ""))


async def run_until_stopped(
    program: Awaitable[ProgramResult],
    stopped: Callable[[], bool],
    grace: float,
    interrupt: Callable[[], Awaitable[int]] | None = None,
) -> ProgramResult:
    """Await the harness program; once ``stopped()`` (the interception refused a call: a limit,
    a stop hook) the program gets SIGTERM (``interrupt``, the box's
    :meth:`~vfray.runtimes.base.Runtime.interrupt`), ``grace`` seconds to exit, and is then
    cancelled, which SIGKILLs its whole process group. Agents that retry a refusal
    (mini-swe-agent backed off for minutes) so end at once. A program still starting (no
    process of it to signal yet: waiting for a launch slot, or bwrap not past its setup) is
    asked again every :data:`INTERRUPT_RETRY` s of the grace until the SIGTERM reaches it. A
    killed program's result says so in its stderr."""
    task = asyncio.ensure_future(program)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=STOP_POLL)
            if done:
                return task.result()
            if stopped():
                break
        since = time.monotonic()
        deadline = since + grace
        if interrupt is not None:
            while not await interrupt() and time.monotonic() < deadline:
                done, _ = await asyncio.wait({task}, timeout=INTERRUPT_RETRY)
                if done:
                    return task.result()
        done, _ = await asyncio.wait({task}, timeout=max(0.0, deadline - time.monotonic()))
        if done:
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return ProgramResult(
            exit_code=-signal.SIGKILL,
            stderr=f"killed {time.monotonic() - since:.1f}s after the rollout was stopped",
        )
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


class AgentSession:
    """The default session: each segment is one run of the program to its exit."""

    def __init__(
        self, harness: Harness, runtime: Runtime, history: Callable[[], Sequence[Message]]
    ) -> None:
        self.harness = harness
        self.runtime = runtime
        self.history = history
        """The conversation as the interception recorded it (used when the box has none)."""
        self.segments = 0

    async def segment(self, ctx: LaunchContext, message: UserContent | None) -> ProgramResult:
        """Run the next segment and wait for it to end. The first is the launch on the task's
        prompt (with ``message`` appended when the user speaks first); each later one resumes
        the conversation with ``message`` (text, or content parts: images) as the new user
        turn."""
        self.segments += 1
        new = [] if message is None else [Message(role="user", content=message)]
        if self.segments == 1:
            if new:
                prompt = [Message.model_validate(m) for m in self.harness.resolve_prompt(ctx.data)]
                ctx = with_conversation(ctx, [*prompt, *new])
            return await self.harness.launch(ctx, self.runtime)
        transcript = await self.harness.read_transcript(self.runtime, ctx)
        history = transcript if transcript is not None else list(self.history())
        return await self.harness.resume(ctx, self.runtime, [*history, *new])

    async def close(self) -> None:
        """End whatever the session still runs (always called, also after a failure)."""

    def artifacts(self) -> list[AgentArtifact]:
        """Files to keep on the trace that the session holds itself once closed (a live
        session's transcript), beside the harness's :meth:`Harness.collect_artifacts`; none by
        default."""
        return []
