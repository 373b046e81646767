"""The client side of an ACP session, answered from inside the rollout's box: permission requests
are granted (the box is the sandbox), ``fs/*`` reads and writes go to the box's files, and
``terminal/*`` commands run as live processes in the box. Every exchange is kept as one JSON line
of the transcript.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from typing import Any

from acp import RequestError
from acp.schema import (
    AllowedOutcome,
    CreateTerminalResponse,
    DeniedOutcome,
    EnvVariable,
    KillTerminalResponse,
    PermissionOption,
    ReadTextFileResponse,
    ReleaseTerminalResponse,
    RequestPermissionResponse,
    TerminalExitStatus,
    TerminalOutputResponse,
    ToolCallUpdate,
    WaitForTerminalExitResponse,
    WriteTextFileResponse,
)
from pydantic import BaseModel

from vfray.errors import SandboxError
from vfray.runtimes.base import Runtime
from vfray.runtimes.live import LiveProcess

TERMINAL_OUTPUT_LIMIT = 1024 * 1024
"""Bytes of a terminal's output kept (its tail) when the agent names no limit."""
ALLOW_KINDS = ("allow_always", "allow_once")
"""Permission options chosen, in order of preference."""


def _record(value: Any) -> Any:
    return (
        value.model_dump(mode="json", by_alias=True, exclude_none=True)
        if isinstance(value, BaseModel)
        else value
    )


_encode_line = json.JSONEncoder(ensure_ascii=False, default=str).encode
"""One encoder for every line: ``json.dumps`` with these options builds a new one per call, a
quarter of a small line's cost (~40 lines a rollout, most of them the agent's stream)."""


class Transcript:
    """The session as JSON lines: what the client sent and what the agent streamed back."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def add(self, kind: str, **fields: Any) -> None:
        entry = {"t": round(time.time(), 3), "kind": kind}
        for name, value in fields.items():
            entry[name] = _record(value)
        self.lines.append(_encode_line(entry))

    def text(self) -> str:
        return "".join(line + "\n" for line in self.lines)


class _Terminal:
    """One ``terminal/create`` command running in the box, its output kept up to a limit."""

    def __init__(self, process: LiveProcess, limit: int) -> None:
        self.process = process
        self.limit = limit
        self.output = bytearray()
        self.truncated = False
        self._readers = [
            asyncio.ensure_future(self._read(process.stdout)),
            asyncio.ensure_future(self._read(process.stderr)),
        ]

    async def _read(self, stream: asyncio.StreamReader) -> None:
        with contextlib.suppress(Exception):
            while chunk := await stream.read(65536):
                self.output += chunk
                if len(self.output) > self.limit:
                    # Keep the tail, cut at a character boundary (ACP asks for valid text).
                    cut = len(self.output) - self.limit
                    while cut < len(self.output) and (self.output[cut] & 0xC0) == 0x80:
                        cut += 1
                    del self.output[:cut]
                    self.truncated = True

    def status(self) -> TerminalExitStatus | None:
        code = self.process.returncode
        if code is None:
            return None
        if code < 0:
            return TerminalExitStatus(exit_code=None, signal=f"signal {-code}")
        return TerminalExitStatus(exit_code=code, signal=None)

    async def wait(self) -> TerminalExitStatus:
        await self.process.wait()
        await asyncio.wait(self._readers, timeout=1.0)
        status = self.status()
        assert status is not None
        return status

    async def stop(self) -> None:
        await self.process.stop(1.0)
        for reader in self._readers:
            reader.cancel()


class BoxClient:
    """Answers one agent's client requests inside ``runtime`` (the ACP ``Client`` protocol)."""

    def __init__(self, runtime: Runtime, transcript: Transcript) -> None:
        self.runtime = runtime
        self.transcript = transcript
        self.terminals: dict[str, _Terminal] = {}

    # -- the agent's stream and its questions ------------------------------------------------

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.transcript.add("update", update=update)

    async def request_permission(
        self,
        session_id: str,
        tool_call: ToolCallUpdate,
        options: list[PermissionOption],
        **kwargs: Any,
    ) -> RequestPermissionResponse:
        # The box is the sandbox: whatever the agent wants to do inside it is allowed.
        chosen = next(
            (o for kind in ALLOW_KINDS for o in options if o.kind == kind),
            None,
        )
        self.transcript.add(
            "permission",
            tool_call=tool_call,
            granted=None if chosen is None else chosen.option_id,
        )
        if chosen is None:
            return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        return RequestPermissionResponse(
            outcome=AllowedOutcome(option_id=chosen.option_id, outcome="selected")
        )

    # -- files ------------------------------------------------------------------------------

    async def read_text_file(
        self,
        session_id: str,
        path: str,
        line: int | None = None,
        limit: int | None = None,
        **kwargs: Any,
    ) -> ReadTextFileResponse:
        try:
            text = (await self.runtime.read(path)).decode("utf-8", errors="replace")
        except (SandboxError, OSError) as exc:
            self.transcript.add("fs_read", path=path, error=str(exc))
            raise RequestError.resource_not_found(path) from exc
        if line is not None or limit is not None:
            lines = text.splitlines(keepends=True)
            start = max(0, (line or 1) - 1)
            text = "".join(lines[start : None if limit is None else start + limit])
        self.transcript.add("fs_read", path=path, chars=len(text))
        return ReadTextFileResponse(content=text)

    async def write_text_file(
        self, session_id: str, path: str, content: str, **kwargs: Any
    ) -> WriteTextFileResponse:
        try:
            # Readable and writable by the agent's own user too (bwrap runs it as nobody).
            await self.runtime.write(path, content.encode(), mode=0o666)
        except (SandboxError, OSError) as exc:
            self.transcript.add("fs_write", path=path, error=str(exc))
            raise RequestError.internal_error({"path": path, "error": str(exc)}) from exc
        self.transcript.add("fs_write", path=path, chars=len(content))
        return WriteTextFileResponse()

    # -- terminals --------------------------------------------------------------------------

    async def create_terminal(
        self,
        session_id: str,
        command: str,
        args: list[str] | None = None,
        env: list[EnvVariable] | None = None,
        cwd: str | None = None,
        output_byte_limit: int | None = None,
        **kwargs: Any,
    ) -> CreateTerminalResponse:
        # A bare command line (no args) is a shell command, as agents send it.
        argv = [command, *args] if args else ["/bin/sh", "-c", command]
        variables = {v.name: v.value for v in env or []}
        try:
            process = await self.runtime.open_process(argv, env=variables, cwd=cwd)
        except (SandboxError, OSError) as exc:
            self.transcript.add("terminal", argv=argv, error=str(exc))
            raise RequestError.internal_error({"error": str(exc)}) from exc
        terminal_id = uuid.uuid4().hex[:12]
        self.terminals[terminal_id] = _Terminal(process, output_byte_limit or TERMINAL_OUTPUT_LIMIT)
        self.transcript.add("terminal", id=terminal_id, argv=argv, cwd=cwd)
        return CreateTerminalResponse(terminal_id=terminal_id)

    def _terminal(self, terminal_id: str) -> _Terminal:
        terminal = self.terminals.get(terminal_id)
        if terminal is None:
            raise RequestError.invalid_params({"terminalId": terminal_id, "error": "unknown"})
        return terminal

    async def terminal_output(
        self, session_id: str, terminal_id: str, **kwargs: Any
    ) -> TerminalOutputResponse:
        terminal = self._terminal(terminal_id)
        return TerminalOutputResponse(
            output=terminal.output.decode("utf-8", errors="replace"),
            truncated=terminal.truncated,
            exit_status=terminal.status(),
        )

    async def wait_for_terminal_exit(
        self, session_id: str, terminal_id: str, **kwargs: Any
    ) -> WaitForTerminalExitResponse:
        status = await self._terminal(terminal_id).wait()
        self.transcript.add("terminal_exit", id=terminal_id, status=status)
        return WaitForTerminalExitResponse(exit_code=status.exit_code, signal=status.signal)

    async def kill_terminal(
        self, session_id: str, terminal_id: str, **kwargs: Any
    ) -> KillTerminalResponse:
        await self._terminal(terminal_id).stop()
        return KillTerminalResponse()

    async def release_terminal(
        self, session_id: str, terminal_id: str, **kwargs: Any
    ) -> ReleaseTerminalResponse:
        terminal = self.terminals.pop(terminal_id, None)
        if terminal is not None:
            await terminal.stop()
        return ReleaseTerminalResponse()

    async def close(self) -> None:
        terminals, self.terminals = list(self.terminals.values()), {}
        await asyncio.gather(*(t.stop() for t in terminals), return_exceptions=True)

    # -- extensions -------------------------------------------------------------------------

    async def ext_method(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self.transcript.add("ext_method", method=method)
        raise RequestError.method_not_found(method)

    async def ext_notification(self, method: str, params: dict[str, Any]) -> None:
        self.transcript.add("ext_notification", method=method, params=params)

    def on_connect(self, conn: Any) -> None:
        return None
