"""The ``podman`` runtime: one container per rollout (``sleep infinity`` + ``podman exec``), driven
by the podman CLI: no daemon, so it runs where clusters have no docker engine, rootful or
rootless.

The box is the docker runtime's (:class:`~vfray.runtimes.docker.DockerRuntime`, whose bridging,
egress gate, forwarders and limit reading it inherits): network ``none`` with host endpoints
through unix sockets bind-mounted in and an in-container forwarder, the network policy's setup and
agent phases, every capability dropped, ``no-new-privileges``, the task's cpus, memory (no swap
past it) and pids, its ``workdir`` (else the image's ``WORKDIR``), the image's ``USER`` or the
``user`` option. Only the transport differs: the CLI (``run -d``, ``exec``, ``cp`` with tar
streams, ``rm -f``), not an engine API. Environment values reach ``podman exec`` through its own
environment (``--env NAME``), never its argv, so secrets are not in the host's process list. A
task's image comes through the node's podman store (:mod:`vfray.runtimes._image_podman`): ``oci:``,
``oci-archive:`` and ``docker-archive:`` read by podman itself, once per store and content.

Containers carry their owner's token as a label; the owner's lifeline reaps them with ``podman
rm -f`` if the owner dies (:func:`vfray.runtimes.lifeline.watch_podman`).

Ulimits: podman 4.3 asks the OCI runtime for nofile 1048576 and nproc 4194304 by default and, as
root, lowers its own RLIMIT_NPROC to 32768 first (traced here); where the process's hard limits
are lower (this VM: 20000 and 96362) and it lacks CAP_SYS_RESOURCE, ``podman run`` fails with
"error setting rlimit type 7/6". So every container gets ``--ulimit`` nofile and nproc at the
process's hard limits, capped at 1048576 and 32768.

Not here: a disk cap (``--storage-opt size`` needs overlay on xfs with quotas; advisory, as on
docker's ext4), GPUs (podman needs CDI specs; refused in one line). Rootless: the user's own store,
no root paths; on cgroup v1, where rootless podman drops cgroup limits, memory is a per-program
data limit and cpus and pids are advisory (:func:`vfray.runtimes._podman_cli.limit_args`);
verified here as root and as a user (docs/runtimes/podman.md).

Measured here (benchmarks/podman_start.py, one run, 8 boxes each, 2 shared cores, the offline
Debian image already in each store): start to first command p50 1397 ms vs docker's 716 ms
(2.0x); one ``run`` 250 vs 73 ms (3.4x: each ``podman exec`` is a CLI process, conmon and a runc
exec); stop 309 vs 90 ms (3.4x). Podman's REST service (``podman system service``) would save the
CLI process per call but is a daemon to keep per node: not built, not measured.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any

from vfray.errors import ConfigError, SandboxError
from vfray.runtimes._box_files import dir_tar, file_tar, untar_file
from vfray.runtimes._bwrap_args import BRIDGE_DIR
from vfray.runtimes._docker_exec import EXEC_ENV
from vfray.runtimes._exec_wait import wait_exec
from vfray.runtimes._executor import blocking
from vfray.runtimes._image_podman import (
    forget_podman_image,
    podman_image,
    podman_image_workdir,
)
from vfray.runtimes._podman_cli import (
    PODMAN_ENV,
    PodmanExecProcess,
    client_env,
    limit_args,
    podman_call,
    ulimit_args,
)
from vfray.runtimes.base import LiveProcess, ProgramResult, RuntimeSpec
from vfray.runtimes.bridge import BOX_FORWARDER
from vfray.runtimes.bwrap import shares_network
from vfray.runtimes.docker import DEFAULT_IMAGE, DockerRuntime
from vfray.runtimes.lifeline import (
    owner_id,
    reap_dead_owners,
    watch_podman,
    watch_root,
)
from vfray.runtimes.live import wait_exit
from vfray.runtimes.processes import LIVE_LINE_LIMIT, MARKER_ENV, OUTPUT_CAP

log = logging.getLogger(__name__)


class PodmanRuntime(DockerRuntime):
    """One podman container per rollout; the docker runtime's box over the podman CLI."""

    type = "podman"
    is_container = True
    isolates_network = True

    def __init__(
        self,
        spec: RuntimeSpec | None = None,
        *,
        podman: str = "podman",
        oci_runtime: str | None = None,
        default_image: str = DEFAULT_IMAGE,
        share_network: bool | None = None,
        volumes: Mapping[str, str] | None = None,
        python: str = "python3",
        output_cap: int = OUTPUT_CAP,
        user: str | None = None,
        max_builds: int = 2,
        build_network: str | None = None,
    ) -> None:
        super().__init__(
            spec,
            default_image=default_image,
            share_network=share_network,
            volumes=volumes,
            python=python,
            output_cap=output_cap,
            user=user,
            max_builds=max_builds,
            build_network=build_network,
        )
        self.podman = podman
        """The podman program (a name on PATH or a path)."""
        self.oci_runtime = oci_runtime
        """podman's ``--runtime`` (``crun``, ``runc``); None: its configured default."""
        self.container_id: str | None = None
        self._workdir_made = False

    def command(self) -> list[str]:
        """The podman command (with its global flags) every call here starts with."""
        found = shutil.which(self.podman) or self.podman
        return [found, *(["--runtime", self.oci_runtime] if self.oci_runtime else [])]

    @staticmethod
    def podman_env() -> dict[str, str]:
        """podman's own environment: :data:`PODMAN_ENV` from this process's."""
        return client_env()

    def engine_url(self) -> str:
        """The store's address, for the image store's locks: podman's command and user."""
        return f"podman {' '.join(self.command())} uid={os.getuid()}"

    @classmethod
    def preflight(cls, options: dict[str, Any]) -> None:
        """Check that podman is installed and answers ``podman info``."""
        try:
            runtime = cls(None, **options)
        except TypeError as exc:
            raise ConfigError(f"bad options for runtime 'podman': {exc}") from exc
        if shutil.which(runtime.podman) is None:
            raise ConfigError(
                f"podman runtime: {runtime.podman!r} not found; install podman "
                "(apt-get install podman) or set --env.runtime.options.podman"
            )
        import subprocess

        done = subprocess.run([*runtime.command(), "info", "--format", "{{.Host.OCIRuntime.Name}}"],
                              capture_output=True, text=True, env=cls.podman_env(),
                              timeout=120, check=False)  # fmt: skip
        if done.returncode:
            why = " ".join(done.stderr.split())[:200]
            raise ConfigError(f"podman runtime: 'podman info' failed ({why})")

    async def _podman(
        self, args: Sequence[str], *, stdin: bytes | None = None, timeout: float = 120
    ) -> tuple[int, bytes, bytes]:
        return await podman_call(self.command(), args, stdin=stdin, timeout=timeout)

    def run_args(self, image: str) -> list[str]:
        """The ``podman run`` arguments for this box (public so the mapping is testable)."""
        assert self.base is not None
        # No --workdir: podman 4.3 refuses one the image lacks (docker makes it); each exec is
        # given it once start() has made it.
        args = ["run", "-d", "--pull=never", "--name", f"vfray-{self.box_id}"]
        for key, value in self.labels().items():
            args += ["--label", f"{key}={value}"]
        args += ["--env", f"{MARKER_ENV}={self.box_id}", "--env", f"HOME={self.box_workdir}"]
        args += ["--volume", f"{self.base / 'bridge'}:{BRIDGE_DIR}:rw"]
        from vfray.runtimes.provision import tools_root

        mounted = set()
        for host, inside in self.volumes.items():
            args += ["--volume", f"{host}:{inside}:ro"]
            mounted.add(host)
        tools = str(tools_root())
        if os.path.isdir(tools) and tools not in mounted:
            args += ["--volume", f"{tools}:{tools}:ro"]
        args += limit_args(self.spec)
        args += ulimit_args()
        args += ["--cap-drop", "ALL", "--security-opt", "no-new-privileges"]
        if self.user is not None:
            args += ["--user", self.user]
        if not shares_network(self.spec, self.share_network):
            args += ["--network", "none"]
        return [*args, "--entrypoint", "sleep", image, "infinity"]

    async def start(self) -> None:
        if self.spec.gpu:
            raise SandboxError(
                f"podman runtime: GPU {self.spec.gpu!r} needs CDI device specs, not supported; "
                "use runtime 'docker'"
            )
        try:
            self.owner = owner_id()
            root = watch_root(None)
            if self.owner is not None:
                engine = watch_podman(self.command(), self.podman_env())
            else:
                engine = None
        except OSError as exc:
            raise SandboxError(f"cannot start the owner's watchdog: {exc}") from exc
        await reap_dead_owners(root, engine)
        await self._make_base(root)
        for attempt in range(2):
            image = await self._image_name()
            await self._take_image_workdir(image)
            try:
                code, out, err = await self._podman(self.run_args(image), timeout=600)
            except FileNotFoundError as exc:
                raise SandboxError(f"podman runtime: {self.podman!r} not found") from exc
            if code == 0:
                self.container_id = self.container = out.decode().split()[-1]
                break
            said = " ".join(err.decode(errors="replace").split())[:600]
            # A container created but not started (its entrypoint missing) stays behind.
            await self._podman(["rm", "-f", "-t", "0", f"vfray-{self.box_id}"])
            if attempt == 0 and self.image_ref is not None and "image not known" in said:
                forget_podman_image(self.engine_url(), image)  # removed from the store since
                continue
            if '"sleep"' in said and "not found" in said:
                raise SandboxError(
                    f"image {self.image!r} has no sleep or /bin/sh: vfray's box runs "
                    f"'sleep infinity' and the task's commands through a shell ({said})"
                )
            raise SandboxError(f"cannot start a {self.image!r} podman container: {said}")
        made = await self.run(["/bin/sh", "-c", 'mkdir -p "$0"', self.box_workdir], timeout=60)
        if made.exit_code == 1:
            # Root without capabilities cannot write to a root-owned 0555 "/" (mmdebstrap's
            # root): podman itself puts the work dir there, as docker's engine does.
            made = await self._make_workdir()
        if not made.ok:
            said = " ".join(f"{made.stdout} {made.stderr}".split())
            if made.exit_code in (126, 127):
                raise SandboxError(
                    f"image {self.image!r} has no /bin/sh; vfray runs its programs and the "
                    f"task's commands through a shell in the box ({said[:200]})"
                )
            raise SandboxError(f"cannot create {self.box_workdir} in the container: {said}")
        self._workdir_made = True
        await self._open_egress()

    async def _take_image_workdir(self, name: str) -> None:
        if self.spec.workdir is None:
            found = await podman_image_workdir(
                name, self.command(), self.podman_env(), store=self.engine_url()
            )
            self.box_workdir = found if found not in ("", "/") else "/work"

    async def _make_workdir(self) -> ProgramResult:
        path = PurePosixPath(self.box_workdir)
        archive = dir_tar(str(path.relative_to("/")), self._ids)
        code, out, err = await self._podman(["cp", "-", f"{self.container_id}:/"], stdin=archive)
        return ProgramResult(exit_code=code, stdout=out.decode(), stderr=err.decode())

    async def _image_name(self) -> str:
        if self.image_ref is None:
            return self.image
        build = [*ulimit_args(), *(["--network", self.build_network] if self.build_network
                                   else [])]  # fmt: skip
        return await podman_image(
            self.image_ref,
            self.command(),
            self.podman_env(),
            store=self.engine_url(),
            max_builds=self.max_builds,
            build_args=build,
        )

    def _exec_args(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: str,
        token: str,
        *,
        stdin: bool,
        user: str | None = None,
    ) -> tuple[list[str], dict[str, str]]:
        """``podman exec`` arguments and the client's environment: box variables by name only,
        their values in the client's environment (podman's own names, as ``NAME=VALUE``)."""
        assert self.container_id is not None
        client = self.podman_env()
        args = ["exec", *(["-i"] if stdin else []), "--workdir", cwd]
        if user is not None:
            args += ["--user", user]
        merged = {MARKER_ENV: self.box_id, "HOME": self.box_workdir, **self._network_env(),
                  **env, EXEC_ENV: token}  # fmt: skip
        for name, value in merged.items():
            # The markers by which processes are signalled go in argv: the client must not
            # carry them, or a SIGTERM meant for the program kills the client and its output.
            if name in PODMAN_ENV or name in (MARKER_ENV, EXEC_ENV):
                args += ["--env", f"{name}={value}"]
            else:
                client[name] = value
                args += ["--env", name]
        return [*args, self.container_id, *argv], client

    async def run(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        *,
        timeout: float | None = None,
        stdin: bytes | None = None,
        user: str | None = None,
    ) -> ProgramResult:
        self._require()
        token = uuid.uuid4().hex
        cwd = self.box_workdir if self._workdir_made else "/"
        args, client_env = self._exec_args(
            argv, env or {}, cwd, token, stdin=stdin is not None, user=user
        )
        started = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            *self.command(),
            *args,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=client_env,
            start_new_session=True,
        )
        job = asyncio.ensure_future(proc.communicate(stdin))

        def kill_client() -> None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()

        (out, err), timed_out = await wait_exec(job, token, self._running, timeout, kill_client)
        code = await wait_exit(proc)
        cap = self.output_cap
        return ProgramResult(
            exit_code=-9 if timed_out else code,
            stdout=out[-cap:].decode("utf-8", errors="replace"),
            stderr=err[-cap:].decode("utf-8", errors="replace"),
            duration=time.monotonic() - started,
            timed_out=timed_out,
            truncated=len(out) > cap or len(err) > cap,
        )

    async def open_process(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> LiveProcess:
        self._require()
        token = uuid.uuid4().hex
        where = str(self._box_path(cwd)) if cwd else self.box_workdir
        user = await self.program_user_ready()
        args, client_env = self._exec_args(argv, env or {}, where, token, stdin=True, user=user)
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.command(),
                *args,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=client_env,
                start_new_session=True,
                limit=LIVE_LINE_LIMIT,
            )
        except OSError as exc:
            raise SandboxError(f"cannot start podman exec: {exc}") from exc
        return self.track(PodmanExecProcess(proc, token))

    async def _put(self, path: PurePosixPath, data: bytes, mode: int) -> None:
        await self._put_at(path, file_tar(path.name, data, mode, self._ids))

    async def _put_tar(
        self, parent: PurePosixPath, archive: bytes, *, keep_ids: bool = False
    ) -> str | None:
        # ``podman cp -`` reads a tar stream; files get the container's user (its --archive)
        # unless the tar's ids are to be kept.
        keep = ["--archive=false"] if keep_ids else []
        code, _, err = await self._podman(
            ["cp", *keep, "-", f"{self.container_id}:{parent}"], stdin=archive
        )
        return err.decode(errors="replace").strip() if code else None

    async def _get_tar(self, path: PurePosixPath) -> bytes | None:
        self._require()
        code, out, _ = await self._podman(["cp", f"{self.container_id}:{path}", "-"])
        return out if code == 0 else None

    async def read(self, path: str) -> bytes:
        self._require()
        target = self._box_path(path)
        code, out, err = await self._podman(["cp", f"{self.container_id}:{target}", "-"])
        if code:
            why = " ".join(err.decode(errors="replace").split())[:300]
            raise SandboxError(f"cannot read {path!r}: {why}")
        return untar_file(out, path)

    async def host_url(self, url: str) -> str:
        self._require()
        assert self.bridges is not None
        port = await self.bridges.add(url)
        if not shares_network(self.spec, self.share_network) and port not in self._forwarded:
            await self._start_forwarder(port)
        return url

    async def _run_forwarder(self, spec: str) -> None:
        assert self.container_id is not None
        code, _, err = await self._podman(
            ["exec", "-d", "--env", f"{MARKER_ENV}={self.box_id}", self.container_id,
             self.python, "-I", "-S", "-c", BOX_FORWARDER, spec, "--"]
        )  # fmt: skip
        if code:
            raise SandboxError(f"cannot start the in-container forwarder: {err.decode().strip()}")

    async def alive(self) -> bool:
        if self.container_id is None or self._stopped:
            return False
        with contextlib.suppress(Exception):
            code, out, _ = await self._podman(
                ["container", "inspect", "--format", "{{json .State.Running}}", self.container_id]
            )
            return code == 0 and json.loads(out or b"false") is True
        return False

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        await self.end_processes()
        if self.container_id is not None or self.base is not None:
            code, _, err = await self._podman(["rm", "-f", "-t", "0", f"vfray-{self.box_id}"])
            said = err.decode(errors="replace")
            if code and "no such container" not in said.lower():
                raise SandboxError(f"cannot remove podman container: {said.strip()[:300]}")
        await self._close_ways()
        if self.base is not None:
            await blocking(shutil.rmtree, self.base, True)
