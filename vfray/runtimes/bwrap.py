"""The ``bwrap`` runtime: each command runs in fresh bubblewrap namespaces over a read-only host.

Every ``run`` spawns ``bwrap --unshare-all --die-with-parent --new-session`` (~6 ms) over the
box's persistent private dirs (work dir at ``spec.workdir`` or ``/work``, ``/tmp``), so files
persist between runs while processes never outlive their run. Network: the box has only its
own loopback, in one namespace per box as root (:mod:`vfray.runtimes._box_netns`: the owner
serves the bridges inside it, so no forwarder starts before a command), else one per run with
the in-box forwarder in front; the hosts its policy admits
(:mod:`vfray.runtimes.network_policy`: setup reaches any host, the agent only
``network_allow``, ``network_block`` never) are reached through the node's egress proxy
(:mod:`vfray.runtimes.egress`), and :meth:`host_url` endpoints through
:mod:`vfray.runtimes.bridge` at the same URL. ``share_network=True`` with no host named or
blocked shares the host network instead.
Programs run as ``nobody`` (:data:`BOX_UID`) in a user namespace with every capability dropped,
cannot create nested user namespaces (``--disable-userns``, bubblewrap 0.8+), and see only the
parts of ``/etc`` in :data:`~vfray.runtimes._bwrap_args.ETC_ENTRIES`. The owner's
interpreter is mounted at its own path wherever it lives. Limits use cgroup v1 (memory, cpu,
pids; :mod:`vfray.runtimes._cgroup_v1`) when writable, else rlimits. A stopped box over the
host's root is emptied and kept warm for the next rollout of its spec
(:mod:`vfray.runtimes._box_pool`) instead of torn down.

A task's image (``spec.image``) is unpacked once per node by the node's image store
(:func:`vfray.runtimes.images.rootfs`, in :meth:`BwrapRuntime.prepare_image`; a Dockerfile or an
image held by the node's Docker engine goes through the engine named by ``docker_url``), and the
box has that root (``spec.rootfs``) instead of the host's, behind a copy-on-write layer of its
own (:mod:`vfray.runtimes._overlay`) thrown away at ``stop``. The image's config applies as in a
container: its environment (``PATH`` first), its ``WORKDIR`` when the task names no work dir,
its user (uid 0 included: the user namespace maps it to the node's user, with no capability;
what the image gives to root is that user's in the box, what it gives to other users is read-only).
``spec.workdir`` is a dir of the image (made when missing), and the node's own programs (its
Python, the forwarder, the agents' tool dir) run there through the node's loader
(:mod:`vfray.runtimes._foreign_root`), never through the image's interpreters.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from vfray.endpoints.serving import in_loop_server
from vfray.errors import SandboxError
from vfray.runtimes._box_netns import BoxNetns
from vfray.runtimes._box_paths import Mount, open_in_box
from vfray.runtimes._box_pool import POOL, WARM_BOXES, Parked
from vfray.runtimes._bwrap_args import (
    BOX_UID,
    BRIDGE_DIR,
    OFFLINE_NSSWITCH,
    host_mounts,
    with_ids,
)
from vfray.runtimes._bwrap_image import ImageBox, in_layer, refuse_mounted
from vfray.runtimes._bwrap_launch import (
    bwrap_args,
    command_env,
    find_bwrap,
    forwarded,
    host_path,
    preflight,
)
from vfray.runtimes._cgroup_v1 import CgroupV1
from vfray.runtimes._executor import blocking
from vfray.runtimes._foreign_root import NodePrograms
from vfray.runtimes._overlay import CowRoot
from vfray.runtimes._small_files import Opener
from vfray.runtimes.base import LiveProcess, RuntimeSpec
from vfray.runtimes.bridge import BridgeSet, ExposedPort, UnixBridge
from vfray.runtimes.egress import EgressGate, check_named_hosts, open_gate
from vfray.runtimes.images import ImageConfig
from vfray.runtimes.lifeline import owner_id
from vfray.runtimes.network_policy import BoxNetwork, box_network
from vfray.runtimes.processes import (
    OUTPUT_CAP,
    kill_group,
    rlimit_setter,
)
from vfray.runtimes.provision import tools_root
from vfray.runtimes.subprocess import SubprocessRuntime

logger = logging.getLogger(__name__)


def shares_network(spec: RuntimeSpec, share_network: bool | None) -> bool:
    """Whether the box shares the node's network unfiltered (:mod:`vfray.runtimes.
    network_policy`: ``share_network=True`` with no host named or blocked), shared with the
    docker runtime."""
    return box_network(spec.network_allow, spec.network_block, share_network).host_network


async def release_warm_boxes() -> None:
    """Let go of every warm box this process keeps (their dirs, cgroups and network
    namespaces), now rather than at exit. For an owner about to be killed: a Ray actor's end
    runs no ``atexit``, and Ray kills the actor's direct children with it, its lifeline watchdog
    among them, so nothing would reap the boxes it had parked."""
    await blocking(POOL.close)


class BwrapRuntime(ImageBox, SubprocessRuntime):
    """Bubblewrap namespaces per run; default-deny network with bridged host endpoints."""

    type = "bwrap"
    isolates_network = True
    warn_no_isolation = False
    RUNS_IMAGES = True
    # bubblewrap dies of SIGTERM (taking the box with it) instead of passing it on: a live
    # process's SIGTERM goes to the boxed program only.
    term_spares = frozenset({"bwrap"})

    def __init__(
        self,
        spec: RuntimeSpec | None = None,
        *,
        share_network: bool | None = None,
        setup_network: bool = False,
        ro_binds: Sequence[str] = (),
        cpu_seconds: int | None = None,
        output_cap: int = OUTPUT_CAP,
        use_cgroups: bool = True,
        root: str | None = None,
        launch_concurrency: int | None = None,
        overlay: Literal["auto", "kernel", "fuse", "copy"] = "auto",
        require_shell: bool = True,
        docker_url: str | None = None,
        warm_boxes: int = WARM_BOXES,
    ) -> None:
        super().__init__(
            spec,
            cpu_seconds=cpu_seconds,
            output_cap=output_cap,
            root=root,
            launch_concurrency=launch_concurrency,
        )
        self.share_network = share_network
        self.setup_network = setup_network
        """Whether runs before :meth:`prepare_execution` (task setup) use the host network."""
        self.ro_binds = tuple(ro_binds)
        self.use_cgroups = use_cgroups
        self.overlay = overlay
        """How a box over an image gets its copy-on-write root (:mod:`vfray.runtimes._overlay`);
        ``auto``: kernel overlayfs as root, else fuse-overlayfs, else a copy."""
        self.require_shell = require_shell
        """Refuse an image root with no ``/bin/sh`` (provisioned agents, the bash tool and most
        scoring hooks start through it); a harness that needs none (``chat``) may say False."""
        self.docker_url = docker_url
        """A Docker engine on the node (``unix:///run/docker.sock``) that builds a task's
        Dockerfile image and holds pre-loaded registry images, exported from it and unpacked;
        without one a registry image is read with skopeo and a Dockerfile is refused."""
        self.warm_boxes = warm_boxes
        """How many stopped boxes of this one's spec the process keeps warm for the next
        rollouts (:mod:`vfray.runtimes._box_pool`; 0: none). Only boxes over the host's root
        with cgroups and a network namespace of their own (as root) are kept."""
        self._oom_base = 0
        self.image_root = self.spec.rootfs
        self.image: ImageConfig | None = None
        """The image's config (environment, work dir, user), when its store unpacked it."""
        self.box_ids = (BOX_UID, BOX_UID)
        """The uid and gid programs run as: ``nobody``'s, or an unpacked image's user."""
        self.layer: CowRoot | None = None
        self.node: NodePrograms | None = None
        self.box_workdir = self.spec.workdir or "/work"
        self.base: Path | None = None
        self.cgroup: CgroupV1 | None = None
        self._cgroup_emptied = False
        self.bridges: BridgeSet | None = None
        self.egress: EgressGate | None = None
        """The box's way out through the node's egress proxy (closed with its bridges)."""
        self.netns: BoxNetns | None = None
        """The box's own network namespace, its bridges served inside it (root only)."""
        self._executing = False
        self._bwrap = ""
        self._prefix: list[str] = []
        self._ways_in: list[tuple[LiveProcess, Path]] = []
        self._exposed: dict[int, ExposedPort] = {}

    async def start(self) -> None:
        self._bwrap = find_bwrap()
        # Before anything is made: a box refused here leaves nothing, warm or not.
        await check_named_hosts(self._network(), self._where)
        key = self._warm_key()
        if key is not None:
            try:
                owner = owner_id()
            except OSError as exc:
                raise SandboxError(f"cannot start the owner's watchdog: {exc}") from exc
            parked = POOL.take(key, owner)
            if parked is not None:
                await self._adopt(parked)
                return
        await super().start()
        assert self.workdir is not None
        self.base = self.workdir
        self.workdir = self.base / "work"
        for sub in ("work", "tmp", "bridge", "etc"):
            (self.base / sub).mkdir(mode=0o777)
        if self.spec.image is not None or self.image_root is not None:
            await self.prepare_image()
            await self._start_image(self.base)
        home = self.box_workdir
        (self.base / "etc" / "passwd").write_text(
            f"root:x:0:0:root:/root:/bin/sh\nnobody:x:{BOX_UID}:{BOX_UID}:nobody:{home}:/bin/sh\n"
        )
        (self.base / "etc" / "group").write_text(f"root:x:0:\nnogroup:x:{BOX_UID}:\n")
        if self.use_cgroups and os.geteuid() == 0:
            # The owner token in the name: the lifeline's reaper finds it after an owner crash.
            self.cgroup = CgroupV1(f"vfray-{self.owner or 'x'}-{self.box_id}", self.spec)
            if not self.cgroup.dirs:
                self.cgroup = None
        if not shares_network(self.spec, self.share_network):
            self.netns = await blocking(BoxNetns.make)
        # In its own namespace the owner serves the bridges there: no socket in the bridge dir.
        self.bridges = BridgeSet(self.base / "bridge", BRIDGE_DIR, sockets=self.netns is None)
        self.egress = await open_gate(self._network(), self.bridges)
        await self._serve_bridges()
        self._prefix = self._mounts()

    @property
    def _where(self) -> str:
        return f"bwrap box {self.box_id}"

    def _warm_key(self) -> str | None:
        """The pool key of this box's spec, or None when it is never kept warm."""
        if self.warm_boxes <= 0 or self.spec.image is not None or self.image_root is not None:
            return None
        if not self.use_cgroups or os.geteuid() != 0:
            return None
        options = (self.share_network, self.setup_network, self.ro_binds, self.root)
        return f"{self.spec.model_dump_json()}|{options!r}"

    async def _adopt(self, box: Parked) -> None:
        """Start as the warm ``box`` (emptied when it was parked): new bridges, its gate back
        to the setup phase."""
        # Its own box id (the mark on its programs' environment): only the box is reused.
        self.owner, self.base = box.owner, box.base
        self.workdir = box.base / "work"
        self.cgroup, self.netns = box.cgroup, box.netns
        self._oom_base = box.cgroup.oom_kills()
        self.bridges = BridgeSet(self.base / "bridge", BRIDGE_DIR, sockets=False)
        self.egress = box.gate  # the same policy: the pool keys on the spec
        if self.egress is not None:
            await self.egress.open(self.bridges)
        await self._serve_bridges()
        tools = str(tools_root())
        # The node's tool dir, made since the box was: mounted as a new box would have it.
        fresh = tools in box.prefix or not os.path.isdir(tools)
        self._prefix = box.prefix if fresh else self._mounts()

    async def _park(self) -> bool:
        """Hand this stopped box to the pool, emptied of its rollout; False when it is not
        kept (the caller tears down the rest)."""
        key = self._warm_key()
        if key is None or self.cgroup is None or self.netns is None or self.base is None:
            return False
        box = Parked(self.base, self.owner, self.cgroup, self.netns, self._prefix, self.egress)
        close_ways = functools.partial(self._close_ways, keep_gate=True)
        if not await POOL.reset_and_park(key, box, self.warm_boxes, close_ways):
            return False
        self._stopped = True
        self._pgids.clear()
        self.cgroup = self.netns = self.bridges = self.egress = None
        self.base = self.workdir = None
        return True

    async def _close_ways(self, keep_gate: bool = False) -> None:
        """The box's bridges, its gate (unless ``keep_gate``: a warm box keeps it) and exposed
        ports closed."""
        if self.bridges is not None:
            await self.bridges.close(keep=self.egress)
        if self.egress is not None and not keep_gate:
            await self.egress.close()
        for exposed in self._exposed.values():
            await exposed.close()
        self._exposed.clear()

    async def _serve_bridges(self) -> None:
        """Each bridge listening in the box's namespace: a connection there is the bridge's."""
        if self.netns is None or self.bridges is None:
            return
        for port, bridge in self.bridges.bridges.items():
            # The bridge's own connection handler, as if it came through its unix socket; a
            # plain bridge to a server of this loop (the interception, run locally) hands the
            # connection to that server instead of relaying it over a second connection.
            plain = type(bridge) is UnixBridge
            direct = in_loop_server(bridge.host, bridge.port) if plain else None
            await self.netns.listen(port, bridge._handle, direct)

    @classmethod
    def preflight(cls, options: dict[str, Any]) -> None:
        """Run ``bwrap … true`` once with the boxes' namespaces and mounts of the host."""
        preflight()

    def _mounts(self) -> list[str]:
        assert self.base is not None and self.workdir is not None
        if self.layer is not None:
            return self._image_mounts()
        return host_mounts(self.base, self.workdir, self.box_workdir, self.ro_binds)

    def _network(self) -> BoxNetwork:
        return box_network(self.spec.network_allow, self.spec.network_block, self.share_network)

    def _isolated(self) -> bool:
        if shares_network(self.spec, self.share_network):
            return False
        return self._executing or not self.setup_network

    def resolve(self, path: str) -> Path:
        """The host path of the box's ``path``, for a look from the host (over an image, its
        links resolved inside the root; over the host's root, as named). The host opens box
        files through :meth:`opener`, which follows no link out of the box."""
        workdir = self._require_workdir()
        assert self.base is not None
        box = Path(self.box_workdir, path)  # an absolute path replaces the work dir
        if self.layer is not None:
            return in_layer(self.layer.root, box, path)
        for inside, outside in (
            (Path(self.box_workdir), workdir),
            (Path("/tmp"), self.base / "tmp"),
        ):
            if box == inside or inside in box.parents:
                return outside / box.relative_to(inside)
        raise SandboxError(
            f"{path!r} is outside the box's writable dirs ({self.box_workdir}, /tmp)"
        )

    def opener(self, path: str) -> Opener:
        """Opens the box's ``path`` from the host as the box finds it: every link on it
        followed as in the box, never out of its root (over an image) or its writable dirs
        (over the host's root) (:mod:`vfray.runtimes._box_paths`)."""
        workdir = self._require_workdir()
        assert self.base is not None
        if self.layer is not None:
            refuse_mounted(Path(self.box_workdir, path), path)
            mounts: tuple[Mount, ...] = (Mount("/", str(self.layer.root)),)
            what = "the box's root"
        else:
            mounts = (Mount(self.box_workdir, str(workdir)), Mount("/tmp", str(self.base / "tmp")))
            what = f"the box's writable dirs ({self.box_workdir}, /tmp)"
        cwd = self.box_workdir

        def open_(flags: int, mode: int) -> int:
            made = bool(flags & os.O_CREAT)
            return open_in_box(mounts, path, flags, mode, cwd=cwd, make_parents=made, what=what)

        return open_

    def _preexec(self) -> Callable[[], None] | None:
        """The rlimits the cgroups do not cover (the cgroups are joined by :meth:`_launcher`'s
        shell: a ``preexec_fn`` costs a full fork of the owner)."""
        cgroup = self.cgroup
        return rlimit_setter(
            None if cgroup else self.spec.memory_gb,
            self.cpu_seconds,
            None if cgroup else self.spec.pids,
        )

    def _emptied(self) -> bool:
        return self._cgroup_emptied

    def _launcher(self) -> list[str]:
        """What starts ``bwrap`` itself: the box's cgroups joined first, when it has them, and
        the box's network namespace entered, when its programs run in it."""
        joins = self.cgroup.join_argv() if self.cgroup is not None else []
        enter = self.netns.enter_argv() if self.netns is not None and self._isolated() else []
        return joins + enter

    def _in_netns(self) -> bool:
        return self.netns is not None and self._isolated()

    def _command(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None,
        cwd: str | None = None,
        serve: str | None = None,
        user: str | None = None,
    ) -> tuple[list[str], dict[str, str], str, Callable[[], None] | None]:
        workdir = self._require_workdir()
        assert self.bridges is not None
        isolated = self._isolated()
        prefix = self._prefix
        if user is not None:
            prefix = with_ids(prefix, *self._user_ids(user))
        prefix = bwrap_args(
            prefix,
            share_net=not isolated or self._in_netns(),
            cwd=cwd,
            box_workdir=self.box_workdir,
            # Name lookups from files only: a phone-home lookup fails at once as unknown
            # (EAI_NONAME), not as a "temporary" failure an agent may keep retrying.
            nsswitch=self._offline_nsswitch() if isolated else None,
        )
        command = list(argv)
        path = host_path()
        python = [sys.executable]
        image_env: dict[str, str] = {}
        if self.node is not None:
            # The node's programs through its loader; the image's PATH, so that its python3 is
            # the image's (a harness that wants its tools first says so in env["PATH"]).
            image_env = self._image_env()
            path = image_env.pop("PATH")
            command = self.program_argv(argv, env)
            python = self.node.argv(python, {})
        # In the box's own namespace the bridges listen already: the forwarder only for a way in.
        bridged = bool(self.bridges.bridges) and not self._in_netns()
        if isolated and (bridged or serve):
            bridge_args = self.bridges.forwarder_args() if bridged else []
            command = forwarded(command, python, bridge_args, serve)
        egress_env = self.egress.env() if self.egress is not None and isolated else {}
        return (
            [*self._launcher(), self._bwrap, *prefix, "--", *command],
            command_env(
                path,
                image_env,
                egress_env,
                env,
                isolated=isolated,
                box_workdir=self.box_workdir,
                box_id=self.box_id,
                owner=self.owner,
            ),
            str(workdir),
            self._preexec(),
        )

    def _offline_nsswitch(self) -> Path:
        assert self.base is not None
        path = self.base / "etc" / "nsswitch-offline.conf"
        if not path.exists():
            path.write_text(OFFLINE_NSSWITCH)
        return path

    def _serve_socket(self) -> str | None:
        # Each bwrap process has a network namespace of its own: a port it listens on is
        # reached through its own forwarder.
        return f"x-{uuid.uuid4().hex[:12]}.sock" if self._isolated() else None

    def _opened(self, process: LiveProcess, serve: str | None) -> None:
        if serve is not None:
            assert self.base is not None
            self._ways_in.append((process, self.base / "bridge" / serve))

    def _listening(self) -> list[Path]:
        """The ways in of the live processes still running, newest first."""
        return [path for proc, path in reversed(self._ways_in) if proc.returncode is None]

    async def expose(self, port: int) -> str:
        self._require_workdir()
        if not self._isolated():
            return f"http://127.0.0.1:{port}"
        exposed = self._exposed.get(port)
        if exposed is None:
            exposed = self._exposed[port] = ExposedPort(port, self._listening)
            await exposed.start()
        return exposed.url

    async def host_url(self, url: str) -> str:
        self._require_workdir()
        assert self.bridges is not None
        await self.bridges.add(url)
        await self._serve_bridges()
        return url

    async def prepare_execution(self, routes: Sequence[str]) -> None:
        for route in routes:
            await self.host_url(route)
        if self.egress is not None:
            await self.egress.enter_agent_phase()
        self._executing = True

    async def alive(self) -> bool:
        return await super().alive() and self.base is not None

    async def limit_hit(self) -> str | None:
        kills = self.cgroup.oom_kills() - self._oom_base if self.cgroup is not None else 0
        if not kills:
            return None
        return f"memory limit of {self.spec.memory_gb:g} GB ({kills} program(s) OOM-killed)"

    async def stop(self) -> None:
        if self._stopped:
            return
        await self.end_processes()
        for pgid in self._pgids:  # the marker sweep follows, batched, in super().stop()
            kill_group(pgid)
        if await self._park():
            return
        if self.cgroup is not None:
            await self.cgroup.destroy()
            # Every program of the box joined its cgroups before exec, and none can leave them
            # (no /sys in the box, all capabilities dropped): destroy killed each one.
            self._cgroup_emptied = not self.cgroup.pids()
            self.cgroup = None
        await self._close_ways()
        if self.netns is not None:
            await self.netns.close()
            self.netns = None
        if self.layer is not None:
            await blocking(self.layer.unmount)
        if self.base is not None:
            self.workdir = self.base  # so the whole box dir is removed
        await super().stop()
