"""A bwrap box's own network namespace (vfray/runtimes/_box_netns.py, as root): every command of
the box runs in it with no in-box forwarder in front, its bridges (the egress gate's port
included) listen inside it, a host URL bridged later is reached there too, and ``stop`` leaves
nothing holding it."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest

from vfray.runtimes._box_netns import BoxNetns
from vfray.runtimes.base import RuntimeSpec
from vfray.runtimes.bridge import BOX_FORWARDER
from vfray.runtimes.bwrap import BwrapRuntime
from vfray.runtimes.egress import EGRESS_PORT

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.skipif(
        shutil.which("bwrap") is None or shutil.which("nsenter") is None or os.geteuid() != 0,
        reason="needs bwrap, nsenter and root",
    ),
]


_GET = "import urllib.request as u; print(u.urlopen({url!r}, timeout=10).read().decode())"


def _held(namespace: str) -> bool:
    """Whether a descriptor of this process holds ``namespace`` (``net:[inode]``)."""
    return namespace in _netns_fds()


def _netns_fds() -> set[str]:
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("net:"):
            found.add(target)
    return found


async def _serve_hello() -> tuple[asyncio.AbstractServer, int]:
    async def hello(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        writer.write(b"HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\nhello")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(hello, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def test_a_box_runs_every_command_in_one_namespace_of_its_own() -> None:
    server, port = await _serve_hello()
    rt = BwrapRuntime(RuntimeSpec(), warm_boxes=0)  # torn down at stop, not kept warm
    await rt.start()
    try:
        assert rt.netns is not None
        assert BOX_FORWARDER not in rt._command(["true"], None)[0]  # no Python before a command
        read_ns = ["readlink", "/proc/self/ns/net"]
        first, second = (await rt.run(read_ns)).stdout, (await rt.run(read_ns)).stdout
        assert first == second and first.strip() != os.readlink("/proc/self/ns/net"), first
        # The gate's port listens inside; a host URL bridged after start is reached too.
        url = f"http://127.0.0.1:{port}/"
        assert await rt.host_url(url) == url
        assert rt.base is not None  # served in the namespace: no unix socket made for either
        assert not list((rt.base / "bridge").glob("*.sock"))
        listening = await rt.run(["cat", "/proc/net/tcp"])
        assert f":{EGRESS_PORT:04X} " in listening.stdout, listening.stdout
        got = await rt.run(
            [rt.python, "-I", "-S", "-c", _GET.format(url=url)], env={"NO_PROXY": "127.0.0.1"}
        )
        assert got.stdout.strip() == "hello", got
        # Nothing else listens there: the gate and the bridge only.
        tcp = (await rt.run(["cat", "/proc/net/tcp"])).stdout.splitlines()[1:]
        assert sum(line.split()[3] == "0A" for line in tcp) == 2, tcp
        box_dir = rt.base
    finally:
        await rt.stop()
        server.close()
    assert rt.netns is None and not _held(first.strip())  # nothing holds the namespace
    assert box_dir is not None and not Path(box_dir).exists()


async def test_without_a_namespace_of_its_own_each_run_goes_through_the_forwarder(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where the owner may not make a namespace (rootless), a run gets one of its own and the
    in-box forwarder listens on the bridged ports first: the bridge answers there too."""
    monkeypatch.setattr(BoxNetns, "make", classmethod(lambda cls: None))
    server, port = await _serve_hello()
    rt = BwrapRuntime(RuntimeSpec(), warm_boxes=0)  # a new box, not a warm one
    await rt.start()
    try:
        assert rt.netns is None
        url = f"http://127.0.0.1:{port}/"
        await rt.host_url(url)
        assert rt.base is not None  # the forwarder's way to the bridge and the gate
        assert {p.name for p in (rt.base / "bridge").glob("*.sock")} == {
            f"{port}.sock",
            f"{EGRESS_PORT}.sock",
        }
        assert BOX_FORWARDER in rt._command(["true"], None)[0]
        got = await rt.run(
            [rt.python, "-I", "-S", "-c", _GET.format(url=url)], env={"NO_PROXY": "127.0.0.1"}
        )
        assert got.stdout.strip() == "hello", got
        failed = await rt.run(["sh", "-c", "exit 7"])
        assert failed.exit_code == 7, failed  # the forwarder passes the exit code on
    finally:
        await rt.stop()
        server.close()


async def test_a_server_of_this_loop_takes_the_boxs_connections_itself() -> None:
    """A bridged URL that ``serve_in_loop`` serves on this loop (a local run's interception):
    the box's connection is handed to that server, with no second connection relayed."""
    from vfray.endpoints.serving import serve_in_loop

    relays: list[int] = []
    rt = BwrapRuntime(RuntimeSpec())

    async def app(scope: dict[str, object], receive: object, send: object) -> None:
        assert scope["type"] == "http"
        assert rt.bridges is not None
        relays.append(sum(len(b._conns) for b in rt.bridges.bridges.values()))
        await send({"type": "http.response.start", "status": 200, "headers": []})  # type: ignore[operator]
        await send({"type": "http.response.body", "body": b"direct"})  # type: ignore[operator]

    async with serve_in_loop(app) as url:
        await rt.start()
        try:
            await rt.host_url(url)
            got = await rt.run(
                [rt.python, "-I", "-S", "-c", _GET.format(url=url + "/x")],
                env={"NO_PROXY": "127.0.0.1"},
            )
        finally:
            await rt.stop()
    assert got.stdout.strip() == "direct", got
    assert relays == [0]  # served with no relay in flight
