"""What the docker and podman runtimes' boxes share above their engine's transport: the box's
host dir, host endpoints reached through an in-container forwarder, box ports exposed through
another, the egress gate's setup and agent phases, and the OOM kills read from the cgroup."""

from __future__ import annotations

import abc
import asyncio
import contextlib
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from vfray.errors import SandboxError
from vfray.runtimes._box_files import dir_tar, owned_tar, tar_files
from vfray.runtimes._bwrap_args import BRIDGE_DIR
from vfray.runtimes._executor import blocking
from vfray.runtimes.base import BOX_DIR, Runtime
from vfray.runtimes.bridge import BridgeSet, ExposedPort
from vfray.runtimes.bwrap import shares_network
from vfray.runtimes.egress import EGRESS_PORT, EgressGate, check_named_hosts, open_gate
from vfray.runtimes.lifeline import work_dir_prefix
from vfray.runtimes.network_policy import box_network
from vfray.runtimes.processes import network_env

_PROBE = """
import socket, sys, time
deadline = time.monotonic() + 10
while True:
    try:
        socket.create_connection(("127.0.0.1", int(sys.argv[1])), 1).close()
        break
    except OSError:
        if time.monotonic() > deadline:
            sys.exit(1)
        time.sleep(0.02)
"""
"""Waits in the box until an in-container forwarder listens on ``argv[1]`` (10 s at most)."""
EXPOSE_SOCKET = "expose.sock"
"""The in-container forwarder's way in for :meth:`DockerRuntime.expose`, in the bridge dir."""


class ContainerBox(Runtime):
    """A container box; its runtime starts it and runs, and starts its forwarders, in it."""

    share_network: bool | None
    python: str
    box_id: str
    box_workdir: str
    owner: str | None
    container: Any
    base: Path | None
    bridges: BridgeSet | None
    egress: EgressGate | None
    _forwarded: set[int]
    _exposer: asyncio.Future[None] | None
    _exposed: dict[int, ExposedPort]
    _stopped: bool
    _program_ids: tuple[str, tuple[int, int]] | None = None
    """The last :attr:`program_user` and its uid and gid in the box."""

    @abc.abstractmethod
    def _require(self) -> Any:
        """The started container (a :class:`SandboxError` when there is none)."""

    @abc.abstractmethod
    async def _run_forwarder(self, spec: str) -> None:
        """Start the in-container forwarder (``BOX_FORWARDER``) for ``spec``, detached."""

    @abc.abstractmethod
    async def _get_tar(self, path: PurePosixPath) -> bytes | None:
        """``path`` read out of the container as a tar (the engine's own, root), or None when
        there is nothing there."""

    @abc.abstractmethod
    async def _put_tar(
        self, parent: PurePosixPath, archive: bytes, *, keep_ids: bool = False
    ) -> str | None:
        """Unpack ``archive`` into ``parent`` by the engine (``keep_ids``: owned as the tar
        says, else as the runtime's writes are); None when done, else why not (``parent``
        missing, say)."""

    async def _put_at(self, path: PurePosixPath, archive: bytes) -> None:
        """Write ``archive`` (one file ``path.name``) into ``path``'s dir, made first only when
        missing: a ``mkdir -p`` is an exec (three engine calls), and the dir is there for
        most writes."""
        if await self._put_tar(path.parent, archive) is None:
            return
        await self._mkdir(path.parent)
        why = await self._put_tar(path.parent, archive)
        if why is not None:
            raise SandboxError(f"cannot write {path}: {why}")

    async def read_tree(self, path: str, limit: int) -> dict[str, bytes] | None:
        # One archive read by the engine, not a `find` exec and a read per file.
        found = await self._get_tar(PurePosixPath(self.box_workdir, path))
        return tar_files(found, limit) if found else {}

    async def _mkdir(self, path: PurePosixPath) -> None:
        made = await self.run(["mkdir", "-p", str(path)], timeout=60)
        if not made.ok and self.program_user is not None:
            # A dir the task's image gave to the agent's user is not the capless root's to
            # write in: that user makes it.
            made = await self.run(["mkdir", "-p", str(path)], timeout=60, user=self.program_user)
        if not made.ok:
            raise SandboxError(f"cannot create {path}: {made.stderr}")

    async def program_user_ready(self) -> str | None:
        """:attr:`program_user` once :data:`BOX_DIR` is its own. The container's root has no
        capabilities (no ``chown``): the engine hands the dir over, reading it out and
        writing it back with the user's ids (resolved by the box's ``/etc/passwd``)."""
        user = self.program_user
        if user is None:
            return None
        cached = self._program_ids
        ids = cached[1] if cached is not None and cached[0] == user else None
        if ids is None:
            said = await self.run(["/bin/sh", "-c", "id -u; id -g"], timeout=60, user=user)
            numbers = said.stdout.split()
            if not said.ok or len(numbers) != 2 or not all(n.isdigit() for n in numbers):
                said_ = " ".join(f"{said.stdout} {said.stderr}".split())[:200]
                raise SandboxError(f"cannot run a program as user {user!r} in the box: {said_}")
            ids = (int(numbers[0]), int(numbers[1]))
            self._program_ids = (user, ids)
        target = PurePosixPath(self.box_workdir, BOX_DIR)
        found = await self._get_tar(target)
        archive = owned_tar(found, ids) if found else dir_tar(target.name, ids)
        why = await self._put_tar(target.parent, archive, keep_ids=True)
        if why is not None:
            raise SandboxError(f"cannot hand {target} to user {user}: {why}")
        return user

    async def _make_base(self, root: str) -> None:
        """The box's host dir under ``root`` (named for the lifeline's reaper), with its bridge."""
        prefix = work_dir_prefix(self.type, self.owner)
        self.base = Path(await blocking(tempfile.mkdtemp, prefix=prefix, dir=root))
        (self.base / "bridge").mkdir(mode=0o777)
        self.bridges = BridgeSet(self.base / "bridge", BRIDGE_DIR)

    async def _close_ways(self) -> None:
        """Close the box's bridged host endpoints and its exposed ports."""
        if self.bridges is not None:
            await self.bridges.close()
        for exposed in self._exposed.values():
            await exposed.close()
        self._exposed.clear()

    async def _open_egress(self) -> None:
        assert self.bridges is not None
        network = box_network(self.spec.network_allow, self.spec.network_block, self.share_network)
        await check_named_hosts(network, f"docker box {self.box_id}")
        self.egress = await open_gate(network, self.bridges)
        if self.egress is not None:
            await self._start_forwarder(EGRESS_PORT)

    def _network_env(self) -> dict[str, str]:
        """The host's proxies when the container has a network (its own TLS roots apply)."""
        if shares_network(self.spec, self.share_network):
            return network_env(os.environ, host_paths=False)
        return self.egress.env() if self.egress is not None else {}

    async def _start_forwarder(self, port: int) -> None:
        await self._run_forwarder(f"{port}={BRIDGE_DIR}/{port}.sock")
        # One exec that waits in the box for the forwarder to listen, not an exec per try:
        # each exec is three engine calls and a runc start for containerd.
        if (await self.run([self.python, "-c", _PROBE, str(port)], timeout=15)).ok:
            self._forwarded.add(port)
            return
        raise SandboxError(f"the in-container forwarder for port {port} did not start")

    async def expose(self, port: int) -> str:
        """The host reaches box ports through one in-container forwarder's way in, whatever
        the container's network (the test engines run without a bridge network)."""
        self._require()
        assert self.base is not None
        way_in = self.base / "bridge" / EXPOSE_SOCKET
        if self._exposer is None:
            self._exposer = asyncio.ensure_future(self._start_exposer(way_in))
        await asyncio.shield(self._exposer)
        exposed = self._exposed.get(port)
        if exposed is None:
            exposed = self._exposed[port] = ExposedPort(port, lambda: [way_in])
            await exposed.start()
        return exposed.url

    async def _start_exposer(self, way_in: Path) -> None:
        await self._run_forwarder(f"@{BRIDGE_DIR}/{EXPOSE_SOCKET}")
        for _ in range(200):
            if way_in.exists():
                return
            await asyncio.sleep(0.05)
        raise SandboxError(f"the in-container forwarder for expose() did not start ({self.python})")

    async def prepare_execution(self, routes: Sequence[str]) -> None:
        for route in routes:
            await self.host_url(route)
        if self.egress is not None:
            await self.egress.enter_agent_phase()

    async def limit_hit(self) -> str | None:
        # The engine's State.OOMKilled stays false when the killed process was an exec'd one
        # (measured here: exit 137, OOMKilled false), so the container's own cgroup counter is
        # read, as the container sees it: v1's memory.oom_control, v2's memory.events.
        if self.container is None or self._stopped or self.spec.memory_gb is None:
            return None
        read = (
            "cat /sys/fs/cgroup/memory/memory.oom_control /sys/fs/cgroup/memory.events 2>/dev/null"
        )
        with contextlib.suppress(Exception):
            result = await self.run(["/bin/sh", "-c", read], timeout=30)
            for line in result.stdout.splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill" and int(value) > 0:
                    return (
                        f"memory limit of {self.spec.memory_gb:g} GB "
                        f"({int(value)} program(s) OOM-killed)"
                    )
        return None
