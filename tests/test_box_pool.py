"""Warm bwrap boxes (vfray/runtimes/_box_pool.py, as root with cgroups): a stopped box of the
same spec is reset and handed to the next rollout, with nothing of the previous rollout
readable or running in it; the pool is bounded per spec, off where the spec differs or
``warm_boxes=0``, and lets go of everything when closed."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from vfray.runtimes._box_pool import POOL
from vfray.runtimes.base import RuntimeSpec
from vfray.runtimes.bwrap import BwrapRuntime

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.skipif(
        shutil.which("bwrap") is None
        or shutil.which("nsenter") is None
        or os.geteuid() != 0
        or not os.access("/sys/fs/cgroup/pids", os.W_OK),
        reason="needs bwrap, nsenter, root and writable cgroup v1",
    ),
]

# Rollout 1 leaves a file in every place a box's program can write, an extended attribute and
# a mode on its work dir, and a process that keeps writing a heartbeat into /tmp.
_LEAVE = """
set -e
echo secret > /work/w.txt; mkdir -p /work/sub/deep; echo s > /work/sub/deep/f
echo secret > /tmp/t.txt; echo secret > /run/vfray-bridge/b.txt
mkfifo /tmp/fifo
python3 -I -c "import os; os.setxattr('/work', 'user.leak', b'1')" 2>/dev/null || true
chmod 0555 /work/sub
"""
_HEARTBEAT = ["sh", "-c", "while :; do date +%s%N >> /tmp/beat; sleep 0.02; done"]


@pytest.fixture(autouse=True)
def _empty_pool() -> Iterator[None]:
    POOL.close()
    yield
    POOL.close()


async def _hello() -> tuple[asyncio.AbstractServer, str]:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        writer.write(b"HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\nhello")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/"


_GET = "import urllib.request as u; print(u.urlopen({url!r}, timeout=10).read().decode())"


async def test_a_warm_box_holds_nothing_of_the_rollout_before() -> None:
    (server1, url1), (server2, url2) = await _hello(), await _hello()
    first = BwrapRuntime(RuntimeSpec())
    await first.start()
    await first.host_url(url1)  # rollout 1's bridge: not reachable from rollout 2
    base, cgroup_dirs = first.base, list(first.cgroup.dirs) if first.cgroup else []
    left = await first.run(["sh", "-c", _LEAVE])
    assert left.exit_code == 0, left
    await first.open_process(_HEARTBEAT)
    await asyncio.sleep(0.2)
    assert (await first.read("/tmp/beat")).strip()
    await first.stop()
    assert POOL.count() == 1

    second = BwrapRuntime(RuntimeSpec())
    await second.start()
    try:
        assert second.base == base and second.cgroup is not None  # the warm box, reused
        assert [str(d) for d in second.cgroup.dirs] == [str(d) for d in cgroup_dirs]
        assert not second.cgroup.pids()  # nothing of rollout 1 runs
        await asyncio.sleep(0.1)
        seen = await second.run(
            [
                "sh",
                "-c",
                "ls -A /work /tmp /run/vfray-bridge; stat -c %a /work; "
                "python3 -I -c \"import os; print(os.listxattr('/work'))\"",
            ]
        )
        assert seen.exit_code == 0, seen
        for name in ("w.txt", "sub", "t.txt", "fifo", "beat", "b.txt"):
            assert name not in seen.stdout.split(), seen.stdout
        assert "777" in seen.stdout.split() and "[]" in seen.stdout, seen.stdout
        ok = await second.run(["sh", "-c", "echo mine > /work/w.txt && cat /work/w.txt"])
        assert ok.stdout.strip() == "mine", ok
        env = {"NO_PROXY": "127.0.0.1"}
        old = await second.run([second.python, "-I", "-S", "-c", _GET.format(url=url1)], env=env)
        assert old.exit_code != 0 and "refused" in old.stderr, old
        await second.host_url(url2)  # its own bridge is served in the kept namespace
        new = await second.run([second.python, "-I", "-S", "-c", _GET.format(url=url2)], env=env)
        assert new.stdout.strip() == "hello", new
    finally:
        await second.stop()
        server1.close()
        server2.close()


# What the box's egress gate answers to a tunnel to a loopback port: its refusal names the phase.
_PROBE = (
    "import socket; s = socket.create_connection(('127.0.0.1', 3128)); "
    "s.sendall(b'CONNECT 127.0.0.1:9 HTTP/1.1\\r\\n\\r\\n'); print(s.recv(4096).decode())"
)


async def test_a_warm_boxs_gate_is_kept_and_back_in_the_setup_phase() -> None:
    first = BwrapRuntime(RuntimeSpec())
    await first.start()
    gate = first.egress
    await first.prepare_execution([])
    agent = await first.run([first.python, "-I", "-S", "-c", _PROBE])
    assert "in the agent phase" in agent.stdout, agent
    await first.stop()

    second = BwrapRuntime(RuntimeSpec())
    await second.start()
    try:
        assert second.egress is gate and gate is not None  # kept, not made again
        assert gate.policy.phase == "setup" and gate.refused == []
        setup = await second.run([second.python, "-I", "-S", "-c", _PROBE])
        assert "the node's own" in setup.stdout, setup  # setup's refusal, not the agent's
        await second.prepare_execution([])
        again = await second.run([second.python, "-I", "-S", "-c", _PROBE])
        assert "in the agent phase" in again.stdout, again
    finally:
        await second.stop()


async def test_the_pool_is_bounded_and_off_where_the_spec_differs() -> None:
    boxes = [BwrapRuntime(RuntimeSpec(), warm_boxes=1) for _ in range(2)]
    for rt in boxes:
        await rt.start()
    bases = [rt.base for rt in boxes]
    for rt in boxes:
        await rt.stop()
    assert POOL.count() == 1  # one kept, the other torn down
    kept = [b for b in bases if b is not None and b.exists()]
    assert len(kept) == 1

    other = BwrapRuntime(RuntimeSpec(memory_gb=1.0))  # another spec: a new box
    off = BwrapRuntime(RuntimeSpec(), warm_boxes=0)  # the pool off: a new box, torn down
    for rt in (other, off):
        await rt.start()
        assert rt.base not in bases
    off_base = off.base
    await off.stop()
    assert off_base is not None and not off_base.exists()
    await other.stop()
    assert POOL.count() == 2

    POOL.close()  # lets go of every kept box: its dir and cgroups
    assert POOL.count() == 0 and not kept[0].exists()
    assert other.base is None and not [
        d for d in Path("/sys/fs/cgroup/pids").iterdir() if d.name.endswith(other.box_id)
    ]


@pytest.mark.skipif(
    not os.access("/sys/fs/cgroup/memory", os.W_OK), reason="needs the memory controller"
)
async def test_a_warm_box_reports_only_its_own_rollouts_oom_kills() -> None:
    spec = RuntimeSpec(memory_gb=0.05)
    first = BwrapRuntime(spec)
    await first.start()
    base = first.base
    hog = "b = bytearray(200 * 1024 * 1024)\nfor i in range(0, len(b), 4096): b[i] = 1"
    killed = await first.run(["python3", "-I", "-S", "-c", hog], timeout=60)
    assert killed.exit_code == 128 + 9, killed
    assert await first.limit_hit() is not None
    await first.stop()

    second = BwrapRuntime(spec)
    await second.start()
    try:
        assert second.base == base  # the same cgroups, whose count says 1 OOM kill
        assert second.cgroup is not None and second.cgroup.oom_kills() >= 1
        assert await second.limit_hit() is None
        again = await second.run(["python3", "-I", "-S", "-c", hog], timeout=60)
        assert again.exit_code == 128 + 9, again
        assert await second.limit_hit() == "memory limit of 0.05 GB (1 program(s) OOM-killed)"
    finally:
        await second.stop()
