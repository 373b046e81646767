"""The ``docker`` runtime: one container per rollout (``sleep infinity`` + exec), docker SDK.

Containers get the task's CPU, memory and pids limits and, by default, network ``none``; host
endpoints from :meth:`DockerRuntime.host_url` are reached through the unix-socket bridge
(:mod:`vfray.runtimes.bridge`), so the image needs a ``python3`` for the in-box forwarder. The
network rule is the bwrap one (:mod:`vfray.runtimes.network_policy`: setup reaches any host but
the blocked ones, the agent its ``network_allow`` hosts, through the node's egress proxy,
:mod:`vfray.runtimes.egress`, and its in-container forwarder on port 3128). Timeouts kill the
exec'd process tree from the host, so the engine must be local. Containers carry their owner's
token as a label, so the owner's lifeline removes them if it dies (:mod:`vfray.runtimes.lifeline`).
Containers run with every capability dropped and ``no-new-privileges``, as the image's ``USER``
or the ``user`` option, in the task's ``workdir``, else the image's ``WORKDIR`` (as ``docker
run`` starts there), else ``/work``. A task's image (any reference
:func:`vfray.runtimes.images.parse_image` reads: a registry image, an archive, an OCI layout, a
Dockerfile) is made present in the engine through the node's image store, once per node and
content.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import socket
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from vfray.errors import ConfigError, SandboxError, optional_import
from vfray.runtimes._docker_exec import EXEC_ENV, open_exec, signal_exec
from vfray.runtimes._docker_files import DockerFiles
from vfray.runtimes._docker_options import container_options, numeric_user
from vfray.runtimes._exec_wait import tail, wait_exec
from vfray.runtimes._executor import blocking, waiting
from vfray.runtimes.base import LiveProcess, ProgramResult, RuntimeSpec
from vfray.runtimes.bridge import BOX_FORWARDER, BridgeSet, ExposedPort
from vfray.runtimes.bwrap import shares_network
from vfray.runtimes.egress import EgressGate
from vfray.runtimes.images import docker_image, forget_docker_image, parse_image
from vfray.runtimes.lifeline import (
    HOST_LABEL,
    OWNER_LABEL,
    owner_id,
    reap_dead_owners,
    watch_docker,
    watch_root,
)
from vfray.runtimes.processes import MARKER_ENV, OUTPUT_CAP

DEFAULT_IMAGE = "python:3.11-slim"
DEFAULT_ENGINE = "unix:///var/run/docker.sock"
_NO_DISK_QUOTA: set[str] = set()
"""Engines (by URL) whose storage driver refused ``storage_opt size``: a task's disk is
advisory there, and their containers start without it."""
_API_VERSIONS: dict[str, str] = {}
"""The API version each engine (by URL) negotiated, so that each box's client does not ask
again (a ``GET /version`` per client)."""
_WORKDIRS: dict[tuple[str, str], str] = {}
"""The ``WORKDIR`` of the task images made present by the node's image store (content-named),
by engine and name: read once, not per box."""
log = logging.getLogger(__name__)


class DockerRuntime(DockerFiles):
    """One container per rollout; default-deny network with bridged host endpoints."""

    type = "docker"
    is_container = True
    RUNS_IMAGES = True
    isolates_network = True

    def __init__(
        self,
        spec: RuntimeSpec | None = None,
        *,
        base_url: str | None = None,
        default_image: str = DEFAULT_IMAGE,
        share_network: bool | None = None,
        volumes: Mapping[str, str] | None = None,
        python: str = "python3",
        output_cap: int = OUTPUT_CAP,
        user: str | None = None,
        max_builds: int = 2,
        build_network: str | None = None,
    ) -> None:
        super().__init__(spec)
        self.image_ref = parse_image(self.spec.image) if self.spec.image else None
        """The task's image, parsed once; None runs ``default_image`` as the engine has it."""
        self.max_builds = max_builds
        """Pulls, loads and builds of task images at once on this node (all its processes)."""
        self.build_network = build_network
        """The network a Dockerfile's ``RUN`` steps get (None: the engine's default)."""
        self.user = user
        """The container's user as ``uid[:gid]``, for images that work as non-root; None keeps
        the image's own ``USER``."""
        self._ids = numeric_user(user) if user is not None else None
        """Its ids, which the work dir and written files are given (root could not hand them
        over from inside: it has no CAP_CHOWN)."""
        self.base_url = base_url
        self.image = self.spec.image or default_image
        self.share_network = share_network
        self.volumes = dict(volumes or {})
        """Host paths mounted read-only into the container, host path -> container path."""
        self.python = python
        self.output_cap = output_cap
        self.box_workdir = self.spec.workdir or "/work"
        self.box_id = uuid.uuid4().hex[:12]
        self.client: Any = None
        self.container: Any = None
        self.base: Path | None = None
        self.bridges: BridgeSet | None = None
        self.egress: EgressGate | None = None
        """The box's way out through the node's egress proxy (closed with its bridges)."""
        self._forwarded: set[int] = set()
        self._running: set[str] = set()
        """Markers of the ``run`` execs in progress (:meth:`interrupt`'s targets)."""
        self._exposer: asyncio.Future[None] | None = None
        self._exposed: dict[int, ExposedPort] = {}
        self.owner: str | None = None
        self._stopped = False
        self._image_ready: str | None = None
        """The engine's name of the task's image, once :meth:`prepare_image` made it present."""

    def _make_client(self) -> Any:
        docker: Any = optional_import("docker", "docker")
        url = self.engine_url()
        version = _API_VERSIONS.get(url)
        if self.base_url is not None:
            client = docker.DockerClient(base_url=self.base_url, version=version)
        else:
            client = docker.from_env(version=version)
        _API_VERSIONS.setdefault(url, client.api.api_version)
        return client

    def labels(self) -> dict[str, str]:
        """The box id, and the owner token and host the lifeline's reaper finds it by."""
        labels = {"vfray.box": self.box_id}
        if self.owner is not None:
            labels.update({OWNER_LABEL: self.owner, HOST_LABEL: socket.gethostname()})
        return labels

    def container_options(self) -> dict[str, Any]:
        """Keyword arguments for ``client.containers.run`` (public so the mapping is testable)."""
        assert self.base is not None
        return container_options(
            self.spec,
            self.base,
            self.volumes,
            box_id=self.box_id,
            box_workdir=self.box_workdir,
            labels=self.labels(),
            disk=self._disk_option(),
            user=self.user,
            shared_network=shares_network(self.spec, self.share_network),
        )

    def _disk_option(self) -> dict[str, str] | None:
        """``storage_opt`` capping the container's writable layer at the task's disk, where this
        engine's storage driver can (btrfs, zfs, or overlay2 on xfs mounted with ``pquota``;
        overlay2 on ext4, as here, cannot: the task's disk is then advisory, logged once)."""
        if self.spec.disk_gb is None or self.engine_url() in _NO_DISK_QUOTA:
            return None
        return {"size": f"{max(1, int(self.spec.disk_gb * 1024))}M"}

    @classmethod
    def preflight(cls, options: dict[str, Any]) -> None:
        """Ping the engine these ``options`` name (the SDK's own client: TLS settings apply)."""
        try:
            runtime = cls(None, **options)
        except TypeError as exc:
            raise ConfigError(f"bad options for runtime 'docker': {exc}") from exc
        url = runtime.engine_url()
        try:
            client = runtime._make_client()
            try:
                client.ping()
            finally:
                client.close()
        except ImportError:
            raise
        except Exception as exc:
            why = " ".join(str(exc).split())[:200]
            raise ConfigError(
                f"docker runtime: no Docker daemon at {url} ({why}); start dockerd, or set "
                "--env.runtime.options.base_url (or DOCKER_HOST)"
            ) from exc

    def engine_url(self) -> str:
        """The engine's address: ``base_url``, else ``$DOCKER_HOST``, else the default socket."""
        return self.base_url or os.environ.get("DOCKER_HOST") or DEFAULT_ENGINE

    async def start(self) -> None:
        try:
            self.owner = owner_id()
            root = watch_root(None)
            if self.owner is not None:
                watch_docker(self.engine_url())
        except OSError as exc:
            raise SandboxError(f"cannot start the owner's watchdog: {exc}") from exc
        await reap_dead_owners(root, self.engine_url())
        await self._make_base(root)
        try:
            self.client = await blocking(self._make_client)
        except Exception as exc:
            if isinstance(exc, ImportError):
                raise
            raise SandboxError(f"cannot reach the docker engine: {exc}") from exc
        for attempt in range(2):
            if attempt == 0 and self._image_ready is not None:
                name = self._image_ready
            else:
                name = await self._image_name()
            await self._take_image_workdir(name)
            try:
                self.container = await blocking(
                    self.client.containers.run, name, **self.container_options()
                )
                break
            except Exception as exc:
                # A container created but not started (its entrypoint missing) stays behind.
                with contextlib.suppress(Exception):
                    await blocking(self._remove_unstarted)
                said = " ".join(str(getattr(exc, "explanation", None) or exc).split())
                if attempt == 0 and "storage-opt" in said and self._disk_option() is not None:
                    # The driver cannot cap a container's disk: advisory on this engine.
                    _NO_DISK_QUOTA.add(self.engine_url())
                    log.warning(
                        "docker engine %s cannot cap a container's disk (%s); task disk limits "
                        "are advisory there",
                        self.engine_url(),
                        said[:200],
                    )
                    continue
                if attempt == 0 and self.image_ref is not None and "No such image" in said:
                    # Removed from the engine since this process made it present: once more.
                    forget_docker_image(self.engine_url(), name)
                    _WORKDIRS.pop((self.engine_url(), name), None)
                    continue
                if 'exec: "sleep"' in said:
                    raise SandboxError(
                        f"image {self.image!r} has no sleep or /bin/sh: vfray's box runs "
                        f"'sleep infinity' and the task's commands through a shell ({said})"
                    ) from exc
                raise SandboxError(f"cannot start a {self.image!r} container: {said}") from exc
        if self._ids is not None:
            # Docker creates the work dir as root; the engine (not the capless box) gives it
            # to the user.
            await self._give_dir(PurePosixPath(self.box_workdir))
        made = await self.run(["/bin/sh", "-c", 'mkdir -p "$0"', self.box_workdir], timeout=60)
        if not made.ok:
            said = " ".join(f"{made.stdout} {made.stderr}".split())
            if made.exit_code in (126, 127) and "/bin/sh" in said:
                raise SandboxError(
                    f"image {self.image!r} has no /bin/sh; vfray runs its programs and the "
                    f"task's commands through a shell in the box ({said[:200]})"
                )
            raise SandboxError(f"cannot create {self.box_workdir} in the container: {said}")
        await self._open_egress()

    async def _take_image_workdir(self, name: str) -> None:
        """With no ``workdir`` named, the box works where ``docker run`` would start: the
        image's ``WORKDIR`` (vfray's ``/work`` when the image has none, or ``/``)."""
        if self.spec.workdir is not None:
            return
        key = (self.engine_url(), name)
        found = _WORKDIRS.get(key)
        if found is None:
            try:
                image = await blocking(self.client.images.get, name)
            except Exception:
                return  # not in the engine: containers.run says why
            found = str((image.attrs.get("Config") or {}).get("WorkingDir") or "")
            if self.image_ref is not None and name == self._image_ready:
                _WORKDIRS[key] = found
        self.box_workdir = found if found not in ("", "/") else "/work"

    def _remove_unstarted(self) -> None:
        for container in self.client.containers.list(
            all=True, filters={"label": f"vfray.box={self.box_id}"}
        ):
            container.remove(force=True)

    async def prepare_image(self) -> None:
        if self.image_ref is not None and self._image_ready is None:
            self._image_ready = await self._image_name()

    async def _image_name(self) -> str:
        """What the engine runs: the task's image, made present through the node's image
        store (a :class:`SandboxError` with the engine's message when it cannot be), else
        ``default_image``."""
        if self.image_ref is None:
            return self.image
        return await docker_image(
            self.image_ref,
            self._make_client,
            engine=self.engine_url(),
            max_builds=self.max_builds,
            build_network=self.build_network,
        )

    def _require(self) -> Any:
        if self.container is None or self._stopped:
            raise SandboxError("docker runtime is not started")
        return self.container

    async def run(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        *,
        timeout: float | None = None,
        stdin: bytes | None = None,
        user: str | None = None,
    ) -> ProgramResult:
        container = self._require()
        command = list(argv)
        if stdin is not None:
            path = f"/tmp/.vfray-stdin-{uuid.uuid4().hex[:12]}"
            await self._put(PurePosixPath(path), stdin, 0o600)
            command = ["sh", "-c", 'exec "$@" < "$0"', path, *argv]
        api = self.client.api
        started = time.monotonic()
        token = uuid.uuid4().hex
        exec_id = (
            await blocking(
                api.exec_create,
                container.id,
                command,
                environment={
                    MARKER_ENV: self.box_id,
                    "HOME": self.box_workdir,
                    **self._network_env(),
                    **(env or {}),
                    EXEC_ENV: token,
                },
                workdir=self.box_workdir,
                # The engine resolves it by the container's /etc/passwd ("": the box's user).
                user=user or "",
            )
        )["Id"]
        job = asyncio.ensure_future(waiting(api.exec_start, exec_id, demux=True))
        (out, err), timed_out = await wait_exec(job, token, self._running, timeout)
        info = await blocking(api.exec_inspect, exec_id)
        stdout, cut_out = tail(out, self.output_cap)
        stderr, cut_err = tail(err, self.output_cap)
        code = info.get("ExitCode")
        return ProgramResult(
            exit_code=-9 if timed_out else (code if code is not None else -1),
            stdout=stdout,
            stderr=stderr,
            duration=time.monotonic() - started,
            timed_out=timed_out,
            truncated=cut_out or cut_err,
        )

    async def interrupt(self) -> int:
        reached = 0
        for token in list(self._running):
            reached += await blocking(signal_exec, token, signal.SIGTERM)
        return reached

    async def open_process(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> LiveProcess:
        container = self._require()
        process = await open_exec(
            self.client.api,
            container.id,
            list(argv),
            {
                MARKER_ENV: self.box_id,
                "HOME": self.box_workdir,
                **self._network_env(),
                **(env or {}),
            },
            str(self._box_path(cwd)) if cwd else self.box_workdir,
            user=await self.program_user_ready() or "",
        )
        return self.track(process)

    async def host_url(self, url: str) -> str:
        self._require()
        assert self.bridges is not None
        port = await self.bridges.add(url)
        if "network_mode" in self.container_options() and port not in self._forwarded:
            await self._start_forwarder(port)
        return url

    async def _run_forwarder(self, spec: str) -> None:
        """Start the in-container forwarder (``BOX_FORWARDER``) for ``spec``, detached."""
        await blocking(
            self._require().exec_run,
            [self.python, "-I", "-S", "-c", BOX_FORWARDER, spec, "--"],
            detach=True,
            environment={MARKER_ENV: self.box_id},
        )

    async def alive(self) -> bool:
        if self.container is None or self._stopped:
            return False
        try:
            await blocking(self.container.reload)
        except Exception:
            return False
        return bool(self.container.status == "running")

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        await self.end_processes()
        if self.container is not None:
            try:
                await blocking(self.container.remove, force=True)
            except Exception as exc:
                if "No such container" not in str(exc):
                    raise SandboxError(f"cannot remove container: {exc}") from exc
        await self._close_ways()
        if self.client is not None:
            await blocking(self.client.close)
        if self.base is not None:
            await blocking(shutil.rmtree, self.base, True)
