"""The unix-socket bridge: how a box with no network reaches one host TCP endpoint.

The host side listens on a unix socket in a directory bind-mounted into the box and forwards each
connection to the host URL; inside the box, :data:`BOX_FORWARDER` (stdlib Python) listens on the
box's own 127.0.0.1:<port> and forwards to that socket. The box sees the same URL as the host.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path
from urllib.parse import urlsplit

from vfray.errors import SandboxError

BOX_FORWARDER = r"""
import os, signal, socket, subprocess, sys, threading
# A stop's SIGTERM reaches the program itself; the forwarder must outlive its cleanup.
signal.signal(signal.SIGTERM, lambda *_: None)
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
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
def serve(listener, path):
    while True:
        conn, _ = listener.accept()
        up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            up.connect(path)
        except OSError:
            conn.close()
            continue
        threading.Thread(target=pipe, args=(conn, up), daemon=True).start()
        threading.Thread(target=pipe, args=(up, conn), daemon=True).start()
sep = sys.argv.index("--")
for spec in sys.argv[1:sep]:
    port, path = spec.split("=", 1)
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", int(port)))
    ls.listen(256)
    threading.Thread(target=serve, args=(ls, path), daemon=True).start()
cmd = sys.argv[sep + 1:]
if not cmd:
    threading.Event().wait()
ready = os.environ.get("VFRAY_READY_FD", "")  # the launch throttle's fd: the program's
ready_fds = (int(ready),) if ready.isdigit() else ()
try:
    proc = subprocess.Popen(cmd, pass_fds=ready_fds)
except OSError as exc:
    print(f"vfray: cannot run {cmd[0]!r}: {exc}", file=sys.stderr)
    sys.exit(127)
for fd in ready_fds:
    try:
        os.close(fd)
    except OSError:
        pass
rc = proc.wait()
sys.exit(rc if rc >= 0 else 128 - rc)
"""
"""Run as ``python -c BOX_FORWARDER PORT=SOCKET... -- argv``: listen, run argv, exit with its
code (a signal death maps to 128+signum, as a shell reports it). With no argv it serves forever."""


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


class UnixBridge:
    """Host side: a unix socket at ``path`` whose connections are forwarded to host:port."""

    def __init__(self, path: Path, host: str, port: int) -> None:
        self.path = path
        self.host = host
        self.port = port
        self._server: asyncio.AbstractServer | None = None
        self._conns: set[asyncio.Task[None]] = set()

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
        if self._server is not None:
            self._server.close()
            self._server = None
        for task in list(self._conns):
            task.cancel()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


class BridgeSet:
    """The bridges of one box: one unix socket per bridged host endpoint, keyed by port."""

    def __init__(self, directory: Path, box_dir: str) -> None:
        self.directory = directory
        self.box_dir = box_dir
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
        await bridge.start()
        self.bridges[port] = bridge
        return port

    def forwarder_args(self) -> list[str]:
        """``PORT=SOCKET`` arguments for :data:`BOX_FORWARDER`, with in-box socket paths."""
        return [f"{port}={self.box_dir}/{port}.sock" for port in sorted(self.bridges)]

    async def close(self) -> None:
        for bridge in self.bridges.values():
            await bridge.close()
        self.bridges.clear()
