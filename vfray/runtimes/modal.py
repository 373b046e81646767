"""The ``modal`` runtime: one Modal Sandbox per rollout (create, exec, file I/O, terminate).

Written against the Modal Python SDK's async interface (``Sandbox.create.aio``, ``exec.aio``,
``filesystem.read_bytes.aio`` / ``write_bytes.aio``, ``terminate.aio``, ``App.lookup.aio``);
every call it makes is checked against the SDK's signatures by the tests (modal 1.6.4), but
never against the live service: its cloud is unreachable where vfray is tested.

A sandbox cannot reach the farm's loopback: it reaches the node's interception through the
node's tunnel (``farm.tunnel``), whose public URL :meth:`ModalRuntime.host_url` passes through,
or through a configured ``public_base_url`` (an ingress in front of the interception) onto which
it maps host URLs; a loopback URL with neither raises ``ConfigError``.

Network: where the task asks for no network (``network_allow`` is ``["*"]``), the sandbox's
egress is an allowlist of the interception's public host alone (its addresses as /32 or /128
CIDRs, and its name as a domain when it has one); with no such route, the network is blocked.
A task that names hosts gets Modal's default (open) network: a URL list is not a domain list.

Agent programs: a Modal box cannot see the node's tool dir, so the tools the harness names
(:meth:`ModalRuntime.plan_tools`) become build steps on the task's image
(``Image.run_commands``, :func:`vfray.runtimes.provision.image_build_commands`): the same pinned
packages installed at the path they have on the node, so a harness launches them alike. Modal
caches each layer by its definition, so a tool is built once per image, not per rollout.

The task's image, parsed once (:func:`vfray.runtimes.images.parse_image`), goes through the
SDK's own builders: a registry reference to ``Image.from_registry``, ``dockerfile:PATH[:CONTEXT]``
to ``Image.from_dockerfile(PATH, context_dir=CONTEXT)`` (built by Modal, so its ``FROM`` must
be an image Modal's builder can pull). The SDK has no builder for an image held in a file
(``docker-archive:``, ``oci:``, ``oci-archive:``; ``from_scratch`` is an empty filesystem to
mount, not a root): such a task is refused in one line (:func:`image_refusal`).
"""

from __future__ import annotations

import asyncio
import ipaddress
import math
import socket
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from vfray.errors import ConfigError, SandboxError, optional_import
from vfray.runtimes._modal_process import ModalProcess
from vfray.runtimes.base import LiveProcess, ProgramResult, Runtime, RuntimeSpec
from vfray.runtimes.images import ImageRef, parse_image
from vfray.runtimes.processes import OUTPUT_CAP
from vfray.runtimes.provision import ToolSpec, image_build_commands, tools_root
from vfray.task import TaskResources

DEFAULT_IMAGE = "python:3.11-slim"
MODAL_TRANSPORTS = ("docker", "dockerfile")
"""The image transports the Modal SDK builds from: a registry, a Dockerfile."""


def image_refusal(ref: ImageRef) -> str | None:
    """Why a Modal box cannot have ``ref`` as its image (one line), or None when it can."""
    if ref.transport in MODAL_TRANSPORTS:
        return None
    return (
        f"image {str(ref)!r}: the modal runtime takes a registry reference or "
        f"dockerfile:PATH[:CONTEXT]; the Modal SDK has no builder for {ref.transport}: images "
        f"(push it to a registry, e.g. skopeo copy {ref.transport}:{ref.path} "
        "docker://REGISTRY/NAME:TAG, or use the docker, podman or bwrap runtime)"
    )


class ModalRuntime(Runtime):
    """A Modal Sandbox per rollout. Network: only the interception's public host where the
    task asks for none (see the module docstring), Modal's default where it names hosts."""

    @classmethod
    def image_refusal(cls, ref: ImageRef) -> str | None:
        return image_refusal(ref)

    type = "modal"
    is_container = True
    RUNS_IMAGES = True
    REMOTE = True
    isolates_network = True
    TOOLS_IN_IMAGE = True

    def __init__(
        self,
        spec: RuntimeSpec | None = None,
        *,
        app_name: str = "vfray",
        default_image: str = DEFAULT_IMAGE,
        public_base_url: str | None = None,
        sandbox_timeout: int = 3600,
        output_cap: int = OUTPUT_CAP,
        exposed_ports: Sequence[int] = (),
    ) -> None:
        super().__init__(spec)
        self.app_name = app_name
        self.image = self.spec.image or default_image
        self.image_ref = parse_image(self.image)
        """The box's image, parsed once; :meth:`build_image` hands it to the SDK's builder."""
        self.public_base_url = public_base_url
        self.sandbox_timeout = sandbox_timeout
        self.output_cap = output_cap
        self.exposed_ports = tuple(exposed_ports)
        """Box ports :meth:`expose` can reach: Modal opens tunnels only when it creates the
        sandbox."""
        self.box_workdir = self.spec.workdir or "/work"
        self.route_hosts: tuple[str, ...] = ()
        """Public hosts the box must reach (the interception's, from :meth:`plan_routes`)."""
        self.allowed: tuple[tuple[str, ...], tuple[str, ...]] | None = None
        """(CIDRs, domains) the created sandbox's egress allows; None: its network is open or
        blocked."""
        self.tools: tuple[ToolSpec, ...] = ()
        """Agent programs built into the box's image (from :meth:`plan_tools`)."""
        self.sandbox: Any = None
        self._stopped = False

    @classmethod
    def preflight(cls, options: dict[str, Any]) -> None:
        """The Modal SDK must be importable (its credentials are checked by its first call)."""
        optional_import("modal", "modal")

    @property
    def open_network(self) -> bool:
        """The task names hosts: Modal's default network, not an allowlist."""
        return any(host != "*" for host in self.spec.network_allow)

    def plan_routes(self, urls: Sequence[str]) -> None:
        hosts: list[str] = []
        for url in urls:
            public = self._public_url(url)
            host = urlsplit(public).hostname if public is not None else None
            if host and host not in hosts:
                hosts.append(host)
        self.route_hosts = tuple(hosts)

    def plan_tools(self, tools: Sequence[ToolSpec]) -> None:
        # Added to, not replaced: seats sharing one box each name their harness's tools. In key
        # order: the same set of tools gives the same layers, which Modal has cached.
        self.tools = tuple(sorted({*self.tools, *tools}, key=lambda spec: spec.key))

    def build_image(self, modal: Any) -> Any:
        """The box's ``modal.Image``: the task's image (``from_registry``, or
        ``from_dockerfile`` with its build context), then one ``run_commands`` layer per
        planned tool (its build commands as ``RUN`` lines), installing it where the node has
        it. Raises :class:`SandboxError` for an image the SDK cannot build from."""
        ref = self.image_ref
        why = image_refusal(ref)
        if why is not None:
            raise SandboxError(why)
        if ref.transport == "dockerfile":
            image = modal.Image.from_dockerfile(ref.path, context_dir=ref.context)
        else:
            image = modal.Image.from_registry(ref.reference)
        root = tools_root()
        for spec in self.tools:
            image = image.run_commands(*image_build_commands(spec, root))
        return image

    async def resolve_routes(self) -> dict[str, list[str]]:
        """Each route host's addresses (an address is its own), as the sandbox's CIDRs."""
        loop = asyncio.get_running_loop()
        found: dict[str, list[str]] = {}
        for host in self.route_hosts:
            if _is_address(host):
                found[host] = [host]
                continue
            try:
                infos = await loop.getaddrinfo(host, None, type=socket.SOCK_STREAM)
            except OSError:
                # Not resolvable here: the domain allowlist alone lets the box reach it.
                found[host] = []
                continue
            found[host] = sorted({str(info[4][0]) for info in infos})
        return found

    def create_options(self, resolved: Mapping[str, Sequence[str]] | None = None) -> dict[str, Any]:
        """Keyword arguments for ``modal.Sandbox.create`` other than ``app`` and ``image``;
        ``resolved`` is :meth:`resolve_routes`' answer (the route hosts' addresses)."""
        options: dict[str, Any] = {
            "timeout": self.sandbox_timeout,
            "workdir": self.box_workdir,
        }
        if self.spec.cpu > 0:
            # (request, limit): the task's resources are the sandbox's hard limits too.
            options["cpu"] = (self.spec.cpu, self.spec.cpu)
        options.update(self._network_options(resolved or {}))
        if self.spec.memory_gb is not None:
            mib = int(self.spec.memory_gb * 1024)
            options["memory"] = (mib, mib)
        if self.spec.gpu:
            options["gpu"] = modal_gpu(self.spec.gpu)
        # A sandbox has no disk option in the SDK (1.x): a task's disk is advisory on modal.
        if self.exposed_ports:
            options["encrypted_ports"] = list(self.exposed_ports)
        return options

    def _network_options(self, resolved: Mapping[str, Sequence[str]]) -> dict[str, Any]:
        self.allowed = None
        if self.open_network:
            return {}
        cidrs: list[str] = []
        domains: list[str] = []
        for host in self.route_hosts:
            if not _is_address(host):
                domains.append(host)
            for address in resolved.get(host, [host] if _is_address(host) else []):
                cidr = str(ipaddress.ip_network(address))  # a bare address is its /32 or /128
                if cidr not in cidrs:
                    cidrs.append(cidr)
        if not cidrs and not domains:
            # Nothing to reach. Modal refuses open ports with ``block_network``; an empty
            # allowlist denies all egress as well and keeps them.
            return (
                {"outbound_cidr_allowlist": []} if self.exposed_ports else {"block_network": True}
            )
        self.allowed = (tuple(cidrs), tuple(domains))
        # Both lists: an HTTP call to a tunnel's name may be matched by name or by address (which
        # one Modal's egress filter uses for plain HTTP is not verified here).
        options: dict[str, Any] = {"outbound_cidr_allowlist": cidrs}
        if domains:
            options["outbound_domain_allowlist"] = domains
        return options

    async def prepare_image(self) -> None:
        """Refuse an image the SDK cannot build from (the rollout's image phase); Modal builds
        the others itself when the sandbox is created."""
        why = image_refusal(self.image_ref)
        if why is not None:
            raise SandboxError(why)

    async def start(self) -> None:
        modal: Any = optional_import("modal", "modal")
        await self.prepare_image()  # before any call to the service
        try:
            app = await modal.App.lookup.aio(self.app_name, create_if_missing=True)
            image = self.build_image(modal)
            options = self.create_options(await self.resolve_routes())
            self.sandbox = await modal.Sandbox.create.aio(
                "sleep", "infinity", app=app, image=image, **options
            )
        except Exception as exc:
            raise SandboxError(f"cannot create a Modal sandbox: {exc}") from exc
        made = await self.run(["mkdir", "-p", self.box_workdir], timeout=60)
        if not made.ok:
            raise SandboxError(f"cannot create {self.box_workdir}: {made.stderr}")

    def _require(self) -> Any:
        if self.sandbox is None or self._stopped:
            raise SandboxError("modal runtime is not started")
        return self.sandbox

    async def run(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        *,
        timeout: float | None = None,
        stdin: bytes | None = None,
        user: str | None = None,
    ) -> ProgramResult:
        sandbox = self._require()
        if user is not None:
            # Modal's Sandbox.exec (SDK 1.x) has no user to run as.
            raise SandboxError(f"the modal runtime cannot run a program as user {user!r}")
        started = time.monotonic()
        # Modal's exec timeout is whole seconds; it kills the process when it expires.
        exec_timeout = max(1, int(timeout + 0.999)) if timeout is not None else None
        process = await sandbox.exec.aio(
            *argv, workdir=self.box_workdir, env=dict(env or {}), timeout=exec_timeout
        )
        # EOF on stdin even with no input: an exec's stdin stays open until closed, and a
        # program that reads a piped stdin (``codex exec`` does) would wait on it forever.
        if stdin is not None:
            process.stdin.write(stdin)
        process.stdin.write_eof()
        await process.stdin.drain.aio()
        stdout, stderr = await asyncio.gather(process.stdout.read.aio(), process.stderr.read.aio())
        code = await process.wait.aio()
        duration = time.monotonic() - started
        timed_out = timeout is not None and duration >= timeout and code != 0
        out, err = str(stdout), str(stderr)
        cap = self.output_cap
        return ProgramResult(
            exit_code=code if code is not None else -1,
            stdout=out[-cap:],
            stderr=err[-cap:],
            duration=duration,
            timed_out=timed_out,
            truncated=len(out) > cap or len(err) > cap,
        )

    async def program_user_ready(self) -> str | None:
        if self.program_user is not None:
            raise SandboxError(
                f"the modal runtime cannot run a program as user {self.program_user!r}"
            )
        return None

    async def open_process(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> LiveProcess:
        """An ``exec`` in the sandbox with its streams pumped into asyncio; it records its pid
        in a file first, so :meth:`LiveProcess.stop` can signal it with ``kill`` (Modal's
        process handle has no signal call)."""
        sandbox = self._require()
        await self.program_user_ready()
        pid_file = f"/tmp/.vfray-pid-{uuid.uuid4().hex[:12]}"
        wrapped = ["sh", "-c", 'echo $$ > "$0"; exec "$@"', pid_file, *argv]
        process = await sandbox.exec.aio(
            *wrapped,
            workdir=self._box_path(cwd) if cwd else self.box_workdir,
            env=dict(env or {}),
            text=False,
        )
        return self.track(ModalProcess(self, process, pid_file))

    def _box_path(self, path: str) -> str:
        return str(PurePosixPath(self.box_workdir, path))

    async def write(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        sandbox = self._require()
        target = self._box_path(path)
        # The SDK's filesystem API (``Sandbox.open`` is gone in modal 1.6) makes the parents.
        try:
            await sandbox.filesystem.write_bytes.aio(data, target)
        except Exception as exc:
            raise SandboxError(f"cannot write {path!r}: {exc}") from exc
        await self.run(["chmod", format(mode, "o"), target], timeout=60)

    async def read(self, path: str) -> bytes:
        sandbox = self._require()
        try:
            return bytes(await sandbox.filesystem.read_bytes.aio(self._box_path(path)))
        except Exception as exc:
            raise SandboxError(f"cannot read {path!r}: {exc}") from exc

    def _public_url(self, url: str) -> str | None:
        """``url`` as the box reaches it; None for a loopback URL with no ``public_base_url``."""
        if self.public_base_url is None:
            if urlsplit(url).hostname in ("127.0.0.1", "localhost", "::1"):
                return None
            return url
        base = urlsplit(self.public_base_url)
        parts = urlsplit(url)
        path = base.path.rstrip("/") + parts.path
        return urlunsplit((base.scheme, base.netloc, path, parts.query, parts.fragment))

    async def host_url(self, url: str) -> str:
        """Map a host URL onto ``public_base_url``, keeping its path and query; without one,
        ``url`` is already public (the node's tunnel) unless it is a loopback address."""
        public = self._public_url(url)
        if public is None:
            raise ConfigError(
                "the modal runtime needs a tunnel (farm.tunnel: ssh or command) or "
                "public_base_url: a public URL in front of the interception endpoint, since "
                "Modal cannot reach this host"
            )
        return public

    async def prepare_execution(self, routes: Sequence[str]) -> None:
        """Every route must be in the egress allowlist the sandbox was created with. One that
        is not (a tunnel reopened at another address since the box started) is refused: the
        rollout fails as a sandbox error and is not run against a box that cannot reach it."""
        if self.allowed is None:
            # Open (the task named hosts), or blocked with no route planned: host_url has
            # already refused a loopback interception URL.
            if self.open_network or not routes:
                return
            raise SandboxError(
                "the Modal sandbox was created with its network blocked, but must reach "
                + ", ".join(routes)
            )
        cidrs, domains = self.allowed
        missing = []
        for route in routes:
            host = urlsplit(route).hostname or ""
            if host in domains:
                continue
            if _is_address(host) and any(
                ipaddress.ip_address(host) in ipaddress.ip_network(c) for c in cidrs
            ):
                continue
            missing.append(route)
        if missing:
            raise SandboxError(
                "the Modal sandbox's egress allowlist ("
                + ", ".join([*cidrs, *domains])
                + ") does not cover "
                + ", ".join(missing)
            )

    async def expose(self, port: int) -> str:
        """The URL of the Modal tunnel to ``port`` (one of ``exposed_ports``)."""
        sandbox = self._require()
        if port not in self.exposed_ports:
            raise ConfigError(
                f"the modal runtime can expose only the ports it was created with: add {port} "
                "to its exposed_ports option"
            )
        tunnels = await sandbox.tunnels.aio()
        return str(tunnels[port].url)

    async def alive(self) -> bool:
        if self.sandbox is None or self._stopped:
            return False
        return await self.sandbox.poll.aio() is None

    async def stop(self) -> None:
        if self._stopped:
            return
        await self.end_processes()  # while the sandbox still runs the kills
        self._stopped = True
        if self.sandbox is not None:
            try:
                await self.sandbox.terminate.aio()
            except Exception as exc:
                raise SandboxError(f"cannot terminate the Modal sandbox: {exc}") from exc


def modal_gpu(gpu: str) -> str:
    """A task's GPU request as the SDK's ``gpu`` (``TYPE[:COUNT]``, whole GPUs): a bare count
    asks for any type (``"2"`` is ``"any:2"``)."""
    res = TaskResources(gpu=gpu)
    count = max(1, math.ceil(res.gpu_count))
    kind = res.gpu_type or "any"
    return kind if count == 1 else f"{kind}:{count}"


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
