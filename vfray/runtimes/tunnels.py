"""Tunnels: how boxes that are not on the node (Modal, a Docker engine elsewhere) reach the node's
interception. A plugin family — ``none``, ``ssh`` (a reverse tunnel to a host the user names),
``command`` (any program that prints a public URL: cloudflared, ngrok, frpc) — and the
:class:`TunnelKeeper` that opens a node's one tunnel when its first remote box needs it, shares
it (sessions are told apart by their secret), restarts it when it dies and closes it with the run.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import os
import re
import signal
from collections.abc import Sequence
from typing import Any, ClassVar
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field

from vfray.errors import ConfigError, InterceptionError
from vfray.runtimes._spawn import PopenProcess, create_subprocess_exec

OPEN_TIMEOUT_S = 30.0
"""Seconds a tunnel program may take to print its public URL."""


class TunnelSettings(BaseModel):
    """``farm.tunnel``: which tunnel a node opens for its remote boxes, and its options."""

    model_config = ConfigDict(extra="forbid")

    type: str = Field("none", description="none, ssh, command, or a 'package.module:Class' path")
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="ssh: host, user, port, identity_file, remote_port, bind_address, "
        "public_host, ssh_options; command: command (with {port}/{url}), pattern",
    )


class Tunnel(abc.ABC):
    """One tunnel in front of one local endpoint; :meth:`open` returns its public origin."""

    type: ClassVar[str]

    @abc.abstractmethod
    async def open(self, local_url: str) -> str:
        """Start the tunnel to ``local_url``'s origin; returns the public origin
        (``scheme://host:port``) at which remote boxes reach it."""

    @abc.abstractmethod
    def alive(self) -> bool: ...

    async def close(self) -> None:  # noqa: B027 - nothing to close by default
        """Stop the tunnel (idempotent)."""


class NoTunnel(Tunnel):
    """Boxes on the node reach the endpoint directly."""

    type = "none"

    async def open(self, local_url: str) -> str:
        parts = urlsplit(local_url)
        return f"{parts.scheme}://{parts.netloc}"

    def alive(self) -> bool:
        return True


class ProcessTunnel(Tunnel):
    """A tunnel that is a program: started, its output read until ``pattern`` finds the public
    URL (group 1 when the pattern has a group), its process group killed at close."""

    pattern: str = r"https?://[^\s\"'<>]+"

    def __init__(self) -> None:
        self.proc: PopenProcess | asyncio.subprocess.Process | None = None
        self._drain: asyncio.Task[None] | None = None
        self.output: list[str] = []

    @abc.abstractmethod
    def argv(self, host: str, port: int) -> list[str]: ...

    def public_origin(self, match: re.Match[str]) -> str:
        found = match.group(1) if match.re.groups else match.group(0)
        parts = urlsplit(found)
        return urlunsplit((parts.scheme, parts.netloc, "", "", ""))

    async def open(self, local_url: str) -> str:
        parts = urlsplit(local_url)
        host, port = parts.hostname or "127.0.0.1", parts.port or 80
        argv = self.argv(host, port)
        try:
            # vfray's spawn, not asyncio's: a vfork on a Ray actor's uvloop too, and a start
            # cancelled mid-way (the run ending) leaves no tunnel program behind.
            self.proc = await create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                cwd=os.getcwd(),
                env=os.environ,
                start_new_session=True,
                preexec_fn=None,
            )
        except OSError as exc:
            raise ConfigError(f"cannot start the {self.type} tunnel ({argv[0]}): {exc}") from exc
        pattern = re.compile(self.pattern)
        try:
            origin = await asyncio.wait_for(self._find(pattern), timeout=OPEN_TIMEOUT_S)
        except (TimeoutError, EOFError):
            tail = " | ".join(self.output[-3:])
            await self.close()
            raise InterceptionError(
                f"the {self.type} tunnel printed no public URL"
                + (f" (last output: {tail})" if tail else "")
            ) from None
        # Keep reading its output, so a full pipe never blocks it.
        self._drain = asyncio.create_task(self._keep_reading())
        return origin

    async def _find(self, pattern: re.Pattern[str]) -> str:
        assert self.proc is not None and self.proc.stdout is not None
        while True:
            raw = await self.proc.stdout.readline()
            if not raw:
                raise EOFError
            line = raw.decode(errors="replace").rstrip()
            self.output = [*self.output[-20:], line]
            match = pattern.search(line)
            if match is not None:
                return self.public_origin(match)

    async def _keep_reading(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        while await self.proc.stdout.readline():
            pass

    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def close(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), timeout=5)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
        if self._drain is not None:
            self._drain.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._drain
            self._drain = None
        if isinstance(proc, PopenProcess):
            proc.close_pipes()


class SshTunnel(ProcessTunnel):
    """``ssh -R``: the named host listens (``remote_port``, 0 = one it picks) and forwards to
    the node's endpoint. Its sshd must allow it (``GatewayPorts clientspecified`` to listen on
    ``bind_address``); remote boxes reach ``http://public_host:port``."""

    type = "ssh"

    def __init__(
        self,
        host: str,
        *,
        user: str | None = None,
        port: int = 22,
        identity_file: str | None = None,
        remote_port: int = 0,
        bind_address: str = "",
        public_host: str | None = None,
        scheme: str = "http",
        ssh_options: Sequence[str] = (),
        ssh: str = "ssh",
    ) -> None:
        super().__init__()
        self.host, self.user, self.port = host, user, port
        self.identity_file = identity_file
        self.remote_port, self.bind_address = remote_port, bind_address
        self.public_host = public_host or host
        self.scheme = scheme
        self.ssh_options = list(ssh_options)
        self.ssh = ssh
        # The port sshd picked (remote_port 0), or, for a fixed port, ssh's debug line saying
        # the forward is up (with ExitOnForwardFailure a refused one ends the program instead).
        self.pattern = (
            r"Allocated port (\d+) for remote forward"
            if remote_port == 0
            else r"remote forward success for: listen"
        )

    def argv(self, host: str, port: int) -> list[str]:
        options = [
            "BatchMode=yes",
            "ExitOnForwardFailure=yes",
            "ServerAliveInterval=10",
            "ServerAliveCountMax=3",
            *self.ssh_options,
        ]
        listen = (
            f"{self.bind_address}:{self.remote_port}"
            if self.bind_address
            else str(self.remote_port)
        )
        argv = [self.ssh, "-v", "-N", "-p", str(self.port)]
        for option in options:
            argv += ["-o", option]
        if self.identity_file:
            argv += ["-i", self.identity_file]
        target = f"{self.user}@{self.host}" if self.user else self.host
        return [*argv, "-R", f"{listen}:{host}:{port}", target]

    def public_origin(self, match: re.Match[str]) -> str:
        port = match.group(1) if match.re.groups else str(self.remote_port)
        return f"{self.scheme}://{self.public_host}:{port}"


class CommandTunnel(ProcessTunnel):
    """Any program that prints a public URL for a local port: ``command`` is an argv (or a
    string split on spaces) in which ``{host}``, ``{port}`` and ``{url}`` are filled in, e.g.
    ``cloudflared tunnel --url {url}``; ``pattern`` is the regex that finds the URL."""

    type = "command"

    def __init__(self, command: Sequence[str] | str, *, pattern: str | None = None) -> None:
        super().__init__()
        self.command = command.split() if isinstance(command, str) else list(command)
        if not self.command:
            raise ConfigError("the command tunnel needs a command")
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ConfigError(f"bad tunnel pattern {pattern!r}: {exc}") from exc
            self.pattern = pattern

    def argv(self, host: str, port: int) -> list[str]:
        url = f"http://{host}:{port}"
        return [part.format(host=host, port=port, url=url) for part in self.command]


TUNNELS: dict[str, type[Tunnel]] = {"none": NoTunnel, "ssh": SshTunnel, "command": CommandTunnel}


def make_tunnel(settings: TunnelSettings) -> Tunnel:
    """The tunnel ``settings`` names (a built-in, or a ``module:Class`` plugin)."""
    cls: Any = TUNNELS.get(settings.type)
    if cls is None:
        if ":" not in settings.type:
            raise ConfigError(
                f"unknown tunnel {settings.type!r} (known: {', '.join(TUNNELS)}, or a "
                "'package.module:Class' path)"
            )
        from vfray._plugins import load_object

        cls = load_object(settings.type)
        if not (isinstance(cls, type) and issubclass(cls, Tunnel)):
            raise ConfigError(f"{settings.type!r} is not a vfray Tunnel subclass")
    try:
        tunnel: Tunnel = cls(**settings.options)
    except TypeError as exc:
        raise ConfigError(f"bad options for tunnel {settings.type!r}: {exc}") from exc
    return tunnel


class TunnelKeeper:
    """A node's one tunnel to ``local_url``: opened on first need, shared, restarted when its
    program died, closed with the run. ``opened`` counts the tunnels it started."""

    def __init__(self, settings: TunnelSettings, local_url: str) -> None:
        make_tunnel(settings)  # refuse bad settings now, not at the first remote box
        self.settings = settings
        self.local_url = local_url
        self.tunnel: Tunnel | None = None
        self.origin: str | None = None
        self.opened = 0
        self._lock = asyncio.Lock()

    async def public_url(self, url: str | None = None) -> str:
        """``url`` (default: the local endpoint) as remote boxes reach it through the tunnel."""
        async with self._lock:
            if self.tunnel is None or not self.tunnel.alive():
                if self.tunnel is not None:
                    await self.tunnel.close()
                tunnel = make_tunnel(self.settings)
                self.origin = await tunnel.open(self.local_url)
                self.tunnel = tunnel
                self.opened += 1
            assert self.origin is not None
        parts = urlsplit(url or self.local_url)
        base = urlsplit(self.origin)
        return urlunsplit((base.scheme, base.netloc, parts.path, parts.query, ""))

    async def close(self) -> None:
        async with self._lock:
            if self.tunnel is not None:
                await self.tunnel.close()
            self.tunnel = None
