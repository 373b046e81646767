"""The unix-socket bridge: how a box with no network reaches one host TCP endpoint, and how the
host reaches a port a program in the box listens on.

The host side listens on a unix socket in a directory bind-mounted into the box and forwards each
connection to the host URL; inside the box, :data:`BOX_FORWARDER` (stdlib Python) listens on the
box's own 127.0.0.1:<port> and forwards to that socket. The box sees the same URL as the host.
The other way (:class:`ExposedPort`), the host listens on 127.0.0.1:<any port> and the in-box
forwarder connects each connection to the box port.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from vfray.errors import SandboxError

BOX_FORWARDER = r"""
# Only what the interpreter has loaded anyway and C modules: every run of a box with a bridge
# starts here, and socket/subprocess/threading took ~25 ms of each to import in a box.
import os, sys, _signal, _socket, _thread
# A stop's SIGTERM reaches the program itself; the forwarder must outlive its cleanup.
_signal.signal(_signal.SIGTERM, lambda *_: None)
def pipe(a, b):
    try:
        while True:
            data = a.recv(65536)
            if not data:
                break
            b.sendall(data)
    except OSError:
        pass
    finally:
        for s in (a, b):
            try:
                s.shutdown(_socket.SHUT_RDWR)
            except OSError:
                pass
def accept(listener):
    return _socket.socket(fileno=listener._accept()[0])
def serve(listener, path):
    while True:
        conn = accept(listener)
        up = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        try:
            up.connect(path)
        except OSError:
            conn.close()
            continue
        _thread.start_new_thread(pipe, (conn, up))
        _thread.start_new_thread(pipe, (up, conn))
def connect_in(conn):
    head = b""
    try:
        while not head.endswith(b"\n") and len(head) < 8:
            data = conn.recv(1)
            if not data:
                break
            head += data
        up = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
        up.settimeout(5)
        up.connect(("127.0.0.1", int(head)))
        up.settimeout(None)
    except (OSError, ValueError):
        try:
            conn.sendall(b"-")
        except OSError:
            pass
        conn.close()
        return
    conn.sendall(b"+")
    _thread.start_new_thread(pipe, (conn, up))
    pipe(up, conn)
def expose(listener):
    while True:
        _thread.start_new_thread(connect_in, (accept(listener),))
sep = sys.argv.index("--")
for spec in sys.argv[1:sep]:
    if spec.startswith("@"):
        # Listening before it appears under its name: a host that sees it can connect.
        ls = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        ls.bind(spec[1:] + ".new")
        os.chmod(spec[1:] + ".new", 0o777)
        ls.listen(256)
        os.rename(spec[1:] + ".new", spec[1:])
        _thread.start_new_thread(expose, (ls,))
        continue
    port, path = spec.split("=", 1)
    ls = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
    ls.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", int(port)))
    ls.listen(256)
    _thread.start_new_thread(serve, (ls, path))
cmd = sys.argv[sep + 1:]
if not cmd:
    forever = _thread.allocate_lock()
    forever.acquire()
    forever.acquire()
ready = os.environ.get("VFRAY_READY_FD", "")  # the launch throttle's fd: the program's
try:
    # posix_spawn (vfork), the signals Python ignores back to their defaults as Popen does.
    pid = os.posix_spawnp(cmd[0], cmd, os.environ,
                          setsigdef=(_signal.SIGPIPE, _signal.SIGXFSZ))
except OSError as exc:
    print(f"vfray: cannot run {cmd[0]!r}: {exc}", file=sys.stderr)
    sys.exit(127)
if ready.isdigit():
    try:
        os.close(int(ready))
    except OSError:
        pass
rc = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
sys.exit(rc if rc >= 0 else 128 - rc)
"""
"""Run as ``python -c BOX_FORWARDER PORT=SOCKET... [@SOCKET] -- argv``: listen, run argv, exit
with its code (a signal death maps to 128+signum, as a shell reports it). With no argv it serves
forever. ``@SOCKET`` is the reverse way in (:class:`ExposedPort`): a connection there names a box
port on its first line (``"8000\n"``), gets ``+`` once connected to it (``-`` when nothing
listens) and is then piped to it."""


def split_host_url(url: str) -> tuple[str, int]:
    """Host and port of an http(s) URL, with the scheme's default port."""
    parts = urlsplit(url)
    if parts.hostname is None:
        raise SandboxError(f"cannot bridge {url!r}: no host")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.hostname, port


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            if writer.can_write_eof():
                writer.write_eof()
            else:
                writer.close()


class _Relay:
    """A host listener whose connections are relayed somewhere; ``close`` stops it and
    cancels the relays in flight."""

    def __init__(self) -> None:
        self._server: asyncio.AbstractServer | None = None
        self._conns: set[asyncio.Task[None]] = set()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for task in list(self._conns):
            task.cancel()


class UnixBridge(_Relay):
    """Host side: a unix socket at ``path`` whose connections are forwarded to host:port."""

    def __init__(self, path: Path, host: str, port: int) -> None:
        super().__init__()
        self.path = path
        self.host = host
        self.port = port

    async def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self._server = await asyncio.start_unix_server(self._handle, path=str(self.path))
        # Boxes may run as another uid (a user namespace, a container user): let them connect.
        os.chmod(self.path, 0o777)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        except OSError:
            writer.close()
            self._conns.discard(task)
            return
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            for w in (writer, up_writer):
                with contextlib.suppress(Exception):
                    w.close()
            self._conns.discard(task)

    async def close(self) -> None:
        await super().close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


class BridgeSet:
    """The bridges of one box: one unix socket per bridged host endpoint, keyed by port.

    With ``sockets=False`` no socket is made: the box's owner serves each bridge's
    connections itself (a box in a network namespace of its own,
    :mod:`vfray.runtimes._box_netns`, where nothing would ever connect to the socket; ~0.2 ms
    of the owner's CPU per bridge)."""

    def __init__(self, directory: Path, box_dir: str, *, sockets: bool = True) -> None:
        self.directory = directory
        self.box_dir = box_dir
        self.sockets = sockets
        self.bridges: dict[int, UnixBridge] = {}

    async def add(self, url: str) -> int:
        """Bridge ``url``'s endpoint; returns the port the box must listen on (the same)."""
        host, port = split_host_url(url)
        existing = self.bridges.get(port)
        if existing is not None:
            if existing.host != host:
                raise SandboxError(f"port {port} is already bridged to {existing.host}")
            return port
        bridge = UnixBridge(self.directory / f"{port}.sock", host, port)
        if self.sockets:
            await bridge.start()
        self.bridges[port] = bridge
        return port

    async def attach(self, port: int, bridge: UnixBridge) -> None:
        """Start ``bridge`` (a socket at ``{port}.sock`` here that serves something other than
        one host endpoint: the egress proxy's gate) as the box's ``port``, closed with the
        rest."""
        existing = self.bridges.get(port)
        if existing is not None:
            raise SandboxError(f"port {port} is already bridged to {existing.host}")
        if self.sockets:
            await bridge.start()
        self.bridges[port] = bridge

    def forwarder_args(self) -> list[str]:
        """``PORT=SOCKET`` arguments for :data:`BOX_FORWARDER`, with in-box socket paths."""
        return [f"{port}={self.box_dir}/{port}.sock" for port in sorted(self.bridges)]

    async def close(self, keep: UnixBridge | None = None) -> None:
        """Every bridge closed but ``keep`` (a warm box's egress gate), which only leaves."""
        for bridge in self.bridges.values():
            if bridge is not keep:
                await bridge.close()
        self.bridges.clear()


class ExposedPort(_Relay):
    """Host side of ``Runtime.expose``: a listener on 127.0.0.1 whose connections are passed
    to box ``port`` through the first of ``sockets()`` (in-box forwarders' ``@SOCKET``s, one
    per network namespace) whose forwarder reaches it."""

    def __init__(self, port: int, sockets: Callable[[], list[Path]]) -> None:
        super().__init__()
        self.port = port
        self.sockets = sockets
        self.url = ""

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        host, port = self._server.sockets[0].getsockname()[:2]
        self.url = f"http://{host}:{port}"
        return self.url

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        for path in self.sockets():
            try:
                reader, writer = await asyncio.open_unix_connection(str(path))
            except OSError:
                continue
            try:
                writer.write(f"{self.port}\n".encode())
                await writer.drain()
                if await reader.read(1) == b"+":
                    return reader, writer
            except OSError:
                pass
            writer.close()
        return None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        try:
            inner = await self._open()
            if inner is None:  # nothing in the box listens there: refuse, as a port would
                return
            await asyncio.gather(_pipe(reader, inner[1]), _pipe(inner[0], writer))
            inner[1].close()
        finally:
            with contextlib.suppress(Exception):
                writer.close()
            self._conns.discard(task)
