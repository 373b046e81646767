"""The ``modal`` runtime: one Modal Sandbox per rollout (create, exec, file I/O, terminate).

Written against the Modal Python SDK's async interface (``Sandbox.create.aio``, ``exec.aio``,
``open.aio``, ``terminate.aio``, ``App.lookup.aio``). UNVERIFIED against the live service: its
cloud is unreachable where vfray is tested. A sandbox cannot reach the farm's loopback, so
:meth:`ModalRuntime.host_url` maps host URLs onto a configured ``public_base_url`` (a tunnel or
ingress in front of the node's interception endpoint); without one it raises ``ConfigError``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from vfray.errors import ConfigError, SandboxError, optional_import
from vfray.runtimes._modal_process import ModalProcess
from vfray.runtimes.base import LiveProcess, ProgramResult, Runtime, RuntimeSpec
from vfray.runtimes.processes import OUTPUT_CAP

DEFAULT_IMAGE = "python:3.11-slim"


class ModalRuntime(Runtime):
    """A Modal Sandbox per rollout. Network: blocked unless the task asks for hosts, in which
    case ``outbound_domain_allowlist`` is not used (a URL list is not a domain list) and the
    sandbox gets Modal's default network."""

    type = "modal"
    is_container = True
    REMOTE = True
    isolates_network = True

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
        self.public_base_url = public_base_url
        self.sandbox_timeout = sandbox_timeout
        self.output_cap = output_cap
        self.exposed_ports = tuple(exposed_ports)
        """Box ports :meth:`expose` can reach: Modal opens tunnels only when it creates the
        sandbox."""
        self.box_workdir = self.spec.workdir or "/work"
        self.sandbox: Any = None
        self._stopped = False

    @classmethod
    def preflight(cls, options: dict[str, Any]) -> None:
        """The Modal SDK must be importable (its credentials are checked by its first call)."""
        optional_import("modal", "modal")

    def create_options(self) -> dict[str, Any]:
        """Keyword arguments for ``modal.Sandbox.create`` other than ``app`` and ``image``."""
        blocked = all(host == "*" for host in self.spec.network_allow)
        options: dict[str, Any] = {
            "timeout": self.sandbox_timeout,
            "workdir": self.box_workdir,
            "cpu": self.spec.cpu,
            "block_network": blocked,
        }
        if self.spec.memory_gb is not None:
            options["memory"] = int(self.spec.memory_gb * 1024)  # MiB
        if self.exposed_ports:
            options["encrypted_ports"] = list(self.exposed_ports)
        return options

    async def start(self) -> None:
        modal: Any = optional_import("modal", "modal")
        try:
            app = await modal.App.lookup.aio(self.app_name, create_if_missing=True)
            image = modal.Image.from_registry(self.image)
            self.sandbox = await modal.Sandbox.create.aio(
                "sleep", "infinity", app=app, image=image, **self.create_options()
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
    ) -> ProgramResult:
        sandbox = self._require()
        started = time.monotonic()
        # Modal's exec timeout is whole seconds; it kills the process when it expires.
        exec_timeout = max(1, int(timeout + 0.999)) if timeout is not None else None
        process = await sandbox.exec.aio(
            *argv, workdir=self.box_workdir, env=dict(env or {}), timeout=exec_timeout
        )
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
        await self.run(["mkdir", "-p", str(PurePosixPath(target).parent)], timeout=60)
        handle = await sandbox.open.aio(target, "wb")
        try:
            await handle.write.aio(data)
        finally:
            await handle.close.aio()
        await self.run(["chmod", format(mode, "o"), target], timeout=60)

    async def read(self, path: str) -> bytes:
        sandbox = self._require()
        try:
            handle = await sandbox.open.aio(self._box_path(path), "rb")
            try:
                return bytes(await handle.read.aio())
            finally:
                await handle.close.aio()
        except Exception as exc:
            raise SandboxError(f"cannot read {path!r}: {exc}") from exc

    async def host_url(self, url: str) -> str:
        """Map a host URL onto ``public_base_url``, keeping its path and query; without one,
        ``url`` is already public (the node's tunnel) unless it is a loopback address."""
        if self.public_base_url is None:
            if urlsplit(url).hostname not in ("127.0.0.1", "localhost", "::1"):
                return url
            raise ConfigError(
                "the modal runtime needs a tunnel (farm.tunnel: ssh or command) or "
                "public_base_url: a public URL in front of the interception endpoint, since "
                "Modal cannot reach this host"
            )
        base = urlsplit(self.public_base_url)
        parts = urlsplit(url)
        path = base.path.rstrip("/") + parts.path
        return urlunsplit((base.scheme, base.netloc, path, parts.query, parts.fragment))

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
