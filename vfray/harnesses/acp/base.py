"""The ACP harness base: one live agent process per rollout, spoken to over stdio with the Agent
Client Protocol. Segment 1 starts the process, opens an ACP session in the box's work dir and
sends the task's prompt; each later segment is a new ``session/prompt`` on the same session, so
the agent resumes with its whole context. The ACP transcript is kept as a rollout artifact.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import json
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from vfray.errors import ConfigError, HarnessError, SandboxError
from vfray.harnesses.base import AgentSession, HarnessConfig, LaunchContext
from vfray.harnesses.provisioned import (
    AGENT_DIR,
    AgentHarnessConfig,
    ProvisionedHarness,
    prompt_text,
)
from vfray.runtimes.base import ProgramResult, Runtime
from vfray.runtimes.live import LiveProcess
from vfray.runtimes.provision import InstalledTool
from vfray.trace import AgentArtifact, Message
from vfray.trace.messages import UserContent, content_text

if TYPE_CHECKING:
    from vfray.harnesses.acp._client import Transcript

TRANSCRIPT_PATH = f"{AGENT_DIR}/acp-transcript.jsonl"
"""The session's ACP transcript: its name on the trace (kept from memory); a bare
:meth:`AcpHarness.launch`, outside a rollout, leaves it at this path in the box."""
STDERR_TAIL = 16 * 1024
"""Bytes of the agent's stderr kept for a failure's message."""
UPDATE = "session/update"
"""The agent's notification of each step of its turn (its stream)."""
CLEAN_STOPS = ("end_turn", "max_tokens", "max_turn_requests", "refusal")
"""Stop reasons of a prompt turn that the agent ended itself (the segment ended cleanly)."""


def _acp() -> Any:
    try:
        import acp
    except ImportError:
        raise ConfigError(
            "the ACP harnesses need the Agent Client Protocol SDK: pip install 'vfray[acp]'"
        ) from None
    return acp


def mcp_servers(urls: Mapping[str, str], init: Any) -> list[Any]:
    """The task's tool servers (name -> streamable-HTTP URL) as ACP ``session/new`` entries:
    ``type: http``, which the agent must announce in ``mcpCapabilities.http`` (both built-in
    adapters do); an agent without it cannot take a task with tools (one HarnessError)."""
    if not urls:
        return []
    schema = _acp().schema
    capabilities = getattr(init, "agent_capabilities", None)
    mcp = getattr(capabilities, "mcp_capabilities", None)
    if not getattr(mcp, "http", False):
        raise HarnessError(
            "the ACP agent does not announce MCP over HTTP (mcpCapabilities.http), so it cannot "
            f"use the task's tools ({', '.join(urls)})"
        )
    return [schema.HttpMcpServer(name=n, url=u, headers=[], type="http") for n, u in urls.items()]


class AcpHarnessConfig(AgentHarnessConfig):
    """Options every ACP harness takes."""

    stop_grace: float = 3.0
    """Seconds the agent process gets to exit after SIGTERM when the session closes."""


class AcpHarness(ProvisionedHarness):
    """A live-session harness: subclasses give the tool to provision, the agent's command line
    and its environment (:meth:`agent_argv`, :meth:`agent_env`)."""

    config_type: ClassVar[type[HarnessConfig]] = AcpHarnessConfig
    config: AcpHarnessConfig
    SUPPORTS_RESUME = True
    SUPPORTS_MCP = True
    """The task's tool servers go to ``session/new`` as ACP HTTP MCP servers."""
    APPENDS_SYSTEM_PROMPT = False

    @classmethod
    def agent_files(cls) -> frozenset[str]:
        """Every ACP harness also keeps the one :data:`TRANSCRIPT_PATH`."""
        return super().agent_files() | {"acp"}

    @abc.abstractmethod
    def agent_argv(self, tool: InstalledTool) -> list[str]:
        """The agent's command line (it speaks ACP on its stdin/stdout)."""

    BOX_PATHS: ClassVar[tuple[str, ...]] = ()
    """Variables of :meth:`agent_env` holding work-dir-relative paths, made absolute in the box
    when the agent starts."""

    @abc.abstractmethod
    async def agent_env(
        self, ctx: LaunchContext, runtime: Runtime, tool: InstalledTool
    ) -> dict[str, str]:
        """The agent's environment (the variables in :attr:`BOX_PATHS` relative to the box's
        work dir); config files it needs may be written into the box here."""

    async def prelude(self, runtime: Runtime, tool: InstalledTool) -> str:
        """Shell run in the box before the agent starts, in the shell that starts it (none by
        default)."""
        return ""

    def __init__(self, config: HarnessConfig | Mapping[str, Any] | None = None) -> None:
        _acp()  # a missing SDK is a config error, before any rollout starts
        super().__init__(config)

    def open_session(
        self, runtime: Runtime, history: Callable[[], Sequence[Message]]
    ) -> AgentSession:
        return AcpSession(self, runtime, history)

    async def launch(self, ctx: LaunchContext, runtime: Runtime) -> ProgramResult:
        """A one-segment session: the prompt, then the process is stopped."""
        session = AcpSession(self, runtime, list)
        try:
            return await session.segment(ctx, None)
        finally:
            await session.close()
            if session.transcript.lines:  # no rollout to keep it: left in the box
                with contextlib.suppress(SandboxError, OSError):
                    await runtime.write(TRANSCRIPT_PATH, session.transcript.text().encode())


class _Pipe:
    """An ACP message transport over a live process's stdin and stdout (newline-delimited
    JSON, lines of any length). The agent's ``session/update`` notifications (its stream:
    ~29 in a 3-call codex-acp rollout) go straight into the transcript as the agent sent them
    and never reach the SDK, which would validate each into pydantic models, open a tracing
    span and a task for it, only for the client to dump it back to JSON."""

    def __init__(self, process: LiveProcess, transcript: Transcript) -> None:
        self.process = process
        self.transcript = transcript
        self._buffer = bytearray()

    async def send(self, message: dict[str, Any]) -> None:
        self.process.stdin.write(json.dumps(message, ensure_ascii=False).encode() + b"\n")
        await self.process.stdin.drain()

    async def receive(self) -> dict[str, Any] | None:
        while True:
            end = self._buffer.find(b"\n")
            if end < 0:
                chunk = await self.process.stdout.read(65536)
                if not chunk:
                    return None
                self._buffer += chunk
                continue
            line = bytes(self._buffer[:end]).strip()
            del self._buffer[: end + 1]
            if not line:
                continue
            try:
                message = json.loads(line)
            except ValueError:
                continue  # a stray log line on stdout is not a message
            if not isinstance(message, dict):
                continue
            if message.get("method") == UPDATE and "id" not in message:
                params = message.get("params")
                update = params.get("update") if isinstance(params, dict) else params
                self.transcript.add("update", update=update)
                continue
            return message

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            self.process.stdin.close()


class AcpSession(AgentSession):
    """One agent process and its ACP session, across the rollout's segments."""

    harness: AcpHarness

    def __init__(
        self, harness: AcpHarness, runtime: Runtime, history: Callable[[], Sequence[Message]]
    ) -> None:
        super().__init__(harness, runtime, history)
        from vfray.harnesses.acp._client import BoxClient, Transcript

        self.transcript = Transcript()
        self.client = BoxClient(runtime, self.transcript)
        self.process: LiveProcess | None = None
        self.connection: Any = None
        self.session_id: str | None = None
        self._stderr = bytearray()
        self._stderr_reader: asyncio.Future[None] | None = None

    async def segment(self, ctx: LaunchContext, message: UserContent | None) -> ProgramResult:
        """Start the agent on the first segment, then send the segment's prompt. An agent that
        dies or breaks the protocol is a failed program (its exit status and stderr), like a
        one-shot harness's, and the rollout goes on to keep its transcript. A turn of content
        parts is sent as its text; one with an image is refused (the session takes text)."""
        message = _turn_text(self.harness.id, message)
        self.segments += 1
        started = asyncio.get_running_loop().time()
        try:
            if self.process is None:
                await self._start(ctx)
                text = prompt_text(self.harness.resolve_prompt(ctx.data))
                if message is not None:
                    text = f"{text}\n\n{message}" if text else message
            else:
                text = message or ""
            return await self._prompt(text, started)
        except HarnessError as exc:
            self.transcript.add("error", message=str(exc))
            code = self.process.returncode if self.process is not None else None
            return self._result(code or 1, str(exc), started)

    async def _start(self, ctx: LaunchContext) -> None:
        acp = _acp()
        tool = await self.harness.box_tool(self.runtime)
        env = await self.harness.agent_env(ctx, self.runtime, tool)
        argv = [*self.harness.agent_argv(tool), *self.harness.config.extra_args]
        # One shell starts the agent and first says the box's work dir (which session/new
        # needs) on its stdout, before the agent's ACP stream: no command of its own to ask.
        exports = "".join(f'{v}="$PWD/${v}"; export {v}; ' for v in self.harness.BOX_PATHS)
        prelude = await self.harness.prelude(self.runtime, tool)
        script = f'{exports}{prelude}printf "%s\\n" "$PWD"; exec "$0" "$@"'
        command = ["/bin/sh", "-c", script, *self.runtime.program_argv(argv, env)]
        self.process = await self.runtime.open_process(command, env=env)
        self.transcript.add("process", argv=argv, pid=self.process.pid)
        self._stderr_reader = asyncio.ensure_future(self._drain_stderr(self.process))
        workdir = (await self._call(self.process.stdout.readline())).decode().strip()
        if not workdir.startswith("/"):
            raise SandboxError(f"cannot find the box's work dir: {workdir!r}")
        self.connection = acp.connect_to_agent(self.client, _Pipe(self.process, self.transcript))
        schema = acp.schema
        capabilities = schema.ClientCapabilities(
            fs=schema.FileSystemCapabilities(read_text_file=True, write_text_file=True),
            terminal=True,
        )
        init = await self._call(
            self.connection.initialize(
                protocol_version=acp.PROTOCOL_VERSION,
                client_capabilities=capabilities,
                client_info=schema.Implementation(name="vfray", version="0"),
            )
        )
        self.transcript.add("initialize", response=init)
        servers = mcp_servers(ctx.mcp_servers, init)
        session = await self._call(self.connection.new_session(cwd=workdir, mcp_servers=servers))
        self.session_id = session.session_id
        self.transcript.add("new_session", cwd=workdir, mcp_servers=servers, response=session)

    async def _prompt(self, text: str, started: float) -> ProgramResult:
        acp = _acp()
        self.transcript.add("prompt", text=text)
        response = await self._call(
            self.connection.prompt(session_id=self.session_id, prompt=[acp.text_block(text)])
        )
        self.transcript.add("prompt_response", response=response)
        reason = str(getattr(response.stop_reason, "value", response.stop_reason))
        if reason in CLEAN_STOPS:
            return self._result(0, f"stop reason: {reason}", started)
        message = f"the agent's turn ended with stop reason {reason!r}"
        return self._result(1, f"{message}\n{self._tail()}".strip(), started)

    async def _call(self, request: Any) -> Any:
        """Await one ACP request, or the agent process's exit, whichever comes first."""
        assert self.process is not None
        call = asyncio.ensure_future(request)
        exited = asyncio.ensure_future(self.process.wait())
        try:
            await asyncio.wait({call, exited}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            exited.cancel()
        if not call.done():
            call.cancel()
            with contextlib.suppress(BaseException):
                await call
            raise await self._gone()
        try:
            return call.result()
        except Exception as exc:
            acp = _acp()
            if isinstance(exc, acp.RequestError):
                detail = f" {exc.data}" if exc.data else ""
                raise HarnessError(f"the ACP agent answered an error: {exc}{detail}") from exc
            if isinstance(exc, ConnectionError):
                raise await self._gone() from exc
            raise

    async def _gone(self) -> HarnessError:
        """The error for an agent whose stdout closed: its exit status (when it exits within
        a moment) and the tail of its stderr."""
        assert self.process is not None
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.process.wait(), 2.0)
        if self._stderr_reader is not None:
            await asyncio.wait({self._stderr_reader}, timeout=1.0)
        code = self.process.returncode
        how = "closed its output" if code is None else f"exited ({code})"
        return HarnessError(f"the ACP agent {how} mid-request: {self._tail()}")

    def _result(self, code: int, message: str, started: float) -> ProgramResult:
        duration = asyncio.get_running_loop().time() - started
        return ProgramResult(exit_code=code, stderr=message, duration=duration)

    async def _drain_stderr(self, process: LiveProcess) -> None:
        with contextlib.suppress(Exception):
            while chunk := await process.stderr.read(65536):
                self._stderr += chunk
                if len(self._stderr) > STDERR_TAIL:
                    del self._stderr[: len(self._stderr) - STDERR_TAIL]

    def _tail(self) -> str:
        return self._stderr.decode("utf-8", errors="replace").strip()[-4000:]

    async def close(self) -> None:
        """Stop the agent and its terminals (the transcript is then complete)."""
        if self.connection is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.connection.close(), 2.0)
        await self.client.close()
        if self.process is not None:
            with contextlib.suppress(Exception):
                code = await self.process.stop(self.harness.config.stop_grace)
                self.transcript.add("process_exit", pid=self.process.pid, status=code)
        if self._stderr_reader is not None:
            self._stderr_reader.cancel()
        if self._stderr:
            self.transcript.add("agent_stderr", tail=self._tail())

    def artifacts(self) -> list[AgentArtifact]:
        """The ACP transcript, kept from memory (no round trip through the box's files)."""
        if not self.transcript.lines:
            return []
        name = TRANSCRIPT_PATH.rsplit("/", 1)[-1]
        return [AgentArtifact.of_bytes(name, self.transcript.text().encode())]


def _turn_text(harness: str, message: UserContent | None) -> str | None:
    """A user turn as the text a live ACP session takes; a turn with other than text parts
    (an image) is refused, naming the harness."""
    if message is None or isinstance(message, str):
        return message
    other = sorted({str(p.get("type")) for p in message if p.get("type") != "text"})
    if other:
        raise HarnessError(
            f"harness {harness!r} keeps one live text-only agent session and cannot send a "
            f"user turn with {', '.join(other)} parts; use a harness that relaunches on the "
            "conversation (e.g. 'null' or 'bash')"
        )
    return content_text(message)
