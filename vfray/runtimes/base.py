"""The :class:`Runtime` contract: the box a harness runs in, whatever it is made of.

Every implementation (subprocess, bwrap, docker, modal) passes
``vfray.testing.check_runtime``. ``stop`` is idempotent and always called by the rollout.
"""

from __future__ import annotations

import abc
import asyncio
import hashlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict

from vfray.runtimes.live import BackgroundProcess, LiveProcess, ProcessInput

if TYPE_CHECKING:
    from vfray.runtimes._image_ref import ImageRef
    from vfray.runtimes.provision import ToolSpec

__all__ = [
    "BackgroundProcess",
    "LiveProcess",
    "ProcessInput",
    "ProgramResult",
    "Runtime",
    "RuntimeSpec",
]

BOX_DIR = ".vfray"
"""vfray's own files in a box, under its work dir (scripts, the uv cache, the agent's dir)."""
UV_CACHE_DIR = ".vfray/uv-cache"
"""uv's cache for :meth:`Runtime.run_uv_script`, relative to the box's work dir (always
writable, removed with the box)."""


def _uv_env(*, offline: bool) -> dict[str, str]:
    env = {"UV_CACHE_DIR": UV_CACHE_DIR, "UV_NO_PROGRESS": "1", "UV_PYTHON_DOWNLOADS": "never"}
    if offline:
        env["UV_OFFLINE"] = "1"
    return env


class ProgramResult(BaseModel):
    """What a finished program left: exit code, captured output (tail-truncated), duration."""

    model_config = ConfigDict(frozen=True)

    exit_code: int
    stdout: str = ""
    stderr: str = ""
    duration: float = 0.0
    timed_out: bool = False
    truncated: bool = False
    """True when stdout/stderr were cut to the runtime's output cap."""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


class RuntimeSpec(BaseModel):
    """What a runtime is asked to provide for one rollout (from the task and the config)."""

    model_config = ConfigDict(frozen=True)

    image: str | None = None
    rootfs: str | None = None
    """The unpacked root filesystem of ``image`` on this node (a directory, never written),
    filled in by the node's image store; the ``bwrap`` runtime boxes on it."""
    workdir: str | None = None
    cpu: float = 1.0
    memory_gb: float | None = None
    pids: int | None = 512
    disk_gb: float | None = None
    """The box's writable layer cap, where the runtime can enforce one (docker, on a storage
    driver with quotas); advisory elsewhere."""
    gpu: str | None = None
    """The task's GPU request as written (``"A100:2"``): modal's ``gpu``, docker's device
    request; placement on a node that has them is the farm's."""
    network_allow: tuple[str, ...] = ("*",)
    network_block: tuple[str, ...] = ()


class Runtime(abc.ABC):
    """A box for one rollout. Paths given to ``read``/``write`` are relative to the work dir
    unless absolute; ``run`` executes argv inside the box with ``env`` added to a scrubbed
    environment (the host's API keys never enter a box)."""

    type: ClassVar[str]
    is_container: ClassVar[bool] = False
    REMOTE: ClassVar[bool] = False
    """Boxes live off the node (Modal, a remote engine): they reach the interception through
    the node's tunnel (``farm.tunnel``), whose public URL :meth:`host_url` is given."""
    isolates_network: ClassVar[bool] = False
    warn_no_isolation: ClassVar[bool] = False
    """Programs in this box can reach everything the farm process can (warned about when a
    harness that executes code runs there)."""
    RUNS_IMAGES: ClassVar[bool] = False
    """Boxes can have a task's image as their root filesystem (docker, podman, modal, bwrap);
    a runtime without it refuses a task with an image (:func:`vfray.runtimes.images.
    refuse_image`)."""

    @classmethod
    def image_refusal(cls, ref: ImageRef) -> str | None:
        """Why boxes of this runtime cannot have ``ref`` as their image (one line), or None:
        asked on the driver before the run, so a kind of image the runtime cannot take is
        refused once rather than on each rollout (Modal has no builder for image files)."""
        return None

    TOOLS_IN_IMAGE: ClassVar[bool] = False
    """The box cannot see the node's tool dir: the agent programs named to :meth:`plan_tools`
    are built into its image instead, each at the path it has on the node."""
    python: str = "python3"
    """How a harness starts Python in this box. Boxes over the host's filesystem use the
    host's real interpreter: a version-manager shim (pyenv) costs ~0.5 s per launch."""

    def __init__(self, spec: RuntimeSpec | None = None) -> None:
        self.spec = spec or RuntimeSpec()
        self._live: list[LiveProcess] = []
        """Live and background processes opened in this box, ended by :meth:`end_processes`."""
        self.program_user: str | None = None
        """The user (as :meth:`run`'s ``user``) that the harness's programs run as: what
        :meth:`run_program` and :meth:`open_process` start (a task's agent user, e.g. Harbor's
        ``[agent] user``); None runs them as the box's user. Set by a task's setup."""

    @classmethod  # noqa: B027 - an optional hook
    def preflight(cls, options: dict[str, Any]) -> None:
        """Check once, before any rollout, that boxes can start here with these constructor
        ``options`` (an engine reachable, a binary that works, an SDK installed). Raises
        :class:`vfray.errors.ConfigError` with one line saying what is wrong and how to fix
        it."""

    @abc.abstractmethod
    async def start(self) -> None:
        """Create the box. Raises :class:`vfray.errors.SandboxError` when it cannot."""

    async def prepare_image(self) -> None:  # noqa: B027 - an optional hook
        """Make the task's image ready on this node (pulled, built or unpacked through the
        node's image store), before :meth:`start`. The rollout runs it as a phase of its own,
        ``image``, under ``timeouts.image``: a long pull or build is not the box's boot.
        Idempotent; :meth:`start` does it when nobody did. Raises
        :class:`vfray.errors.SandboxError` (one line) when the image cannot be had."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Destroy the box and every process in it. Idempotent; safe before/after start."""

    @abc.abstractmethod
    async def run(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        *,
        timeout: float | None = None,
        stdin: bytes | None = None,
        user: str | None = None,
    ) -> ProgramResult:
        """Run a command to completion inside the box.

        ``user``: run it as this user of the box (``name``, ``uid`` or either with
        ``:group``), resolved by the box's own ``/etc/passwd``; None runs it as the box's
        user. A runtime that cannot switch users raises :class:`vfray.errors.SandboxError`
        in one line for any user but its own."""

    def program_argv(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> list[str]:
        """``argv`` (a node program, e.g. an agent from the tool dir) as a command line the
        box's own shell can ``exec``: the same here; a box over an image starts the node's
        programs through the node's loader (``vfray.runtimes._foreign_root``). ``run`` and
        ``run_program`` do this to their own ``argv``; a harness that hands a program to a
        shell in the box does it first."""
        return list(argv)

    async def run_program(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        *,
        timeout: float | None = None,
        signals_ready: bool = False,
    ) -> ProgramResult:
        """Run the harness program; same as :meth:`run` unless a runtime needs otherwise.

        ``signals_ready``: the program writes a byte to the fd named by ``$VFRAY_READY_FD``
        (when set) once it has started; a runtime that throttles launches
        (:mod:`vfray.runtimes.launches`) holds the program's launch slot until then.
        It runs as :attr:`program_user`, to whom :data:`BOX_DIR` is handed first."""
        user = await self.program_user_ready()
        if user is None:  # a runtime written before ``run`` took ``user`` still works
            return await self.run(argv, env, timeout=timeout)
        return await self.run(argv, env, timeout=timeout, user=user)

    async def program_user_ready(self) -> str | None:
        """:attr:`program_user`, once :data:`BOX_DIR` (the agent's files a harness wrote
        there as the box's user) is its own, so the program can write its state beside them.
        Here the box's user hands them over with ``chown`` (a root with its capabilities);
        docker and podman, whose root has none, hand them over by the engine; bwrap's user
        namespace maps the user onto the node's, who owns them; subprocess and modal refuse
        another user."""
        from vfray.errors import SandboxError

        user = self.program_user
        if user is None:
            return None
        script = f'mkdir -p {BOX_DIR} && chown -R "$0" {BOX_DIR}'
        handed = await self.run(["/bin/sh", "-c", script, user], timeout=120)
        if not handed.ok:
            raise SandboxError(f"cannot hand {BOX_DIR} to user {user}: {handed.stderr.strip()}")
        return user

    async def open_process(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> LiveProcess:
        """Start ``argv`` in the box with its standard streams open to the caller (an ACP agent
        spoken to over stdio). ``env`` is added to the box's scrubbed environment as in
        :meth:`run`; ``cwd`` is relative to the work dir unless absolute. The process dies
        with the box. A program that cannot start raises :class:`vfray.errors.SandboxError`
        or exits non-zero (127), depending on the runtime."""
        from vfray.errors import SandboxError

        raise SandboxError(f"the {self.type} runtime cannot open live processes")

    async def run_background(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> BackgroundProcess:
        """Start a long-lived helper (a tool server) in the box, its output drained into a
        tail; it is stopped with the box."""
        return BackgroundProcess(await self.open_process(argv, env=env, cwd=cwd))

    async def expose(self, port: int) -> str:
        """A URL (``http://host:port``) at which the host reaches ``port`` that a program in
        the box listens on (on the box's loopback or any address)."""
        from vfray.errors import SandboxError

        raise SandboxError(f"the {self.type} runtime cannot expose box ports")

    async def interrupt(self) -> int:
        """Send SIGTERM to every program :meth:`run`/:meth:`run_program` is running in the box
        now, and to their children: the rollout's stop (a refused call) asks the harness
        program to end before it is killed. Live processes are not touched (their owner stops
        them). Returns how many programs it reached: 0 while the program is still starting, so
        the caller asks again. Optional: cancelling a run still kills it."""
        return 0

    def track(self, process: LiveProcess) -> LiveProcess:
        """Remember ``process`` so :meth:`end_processes` ends it with the box."""
        self._live.append(process)
        return process

    async def end_processes(self, grace: float = 0.0) -> None:
        """Stop every live and background process opened in this box (``stop`` calls it)."""
        live, self._live = self._live, []
        await asyncio.gather(*(p.stop(grace) for p in live), return_exceptions=True)

    @abc.abstractmethod
    async def read(self, path: str) -> bytes:
        """Read a file from the box."""

    async def read_tree(self, path: str, limit: int) -> dict[str, bytes] | None:
        """The regular files under the dir ``path`` (``limit`` at most; relative paths as
        in :meth:`read`), by their path under it, read in one go; ``{}`` when there is no such
        dir; None where this runtime has no such read (read the files one by one)."""
        return None

    @abc.abstractmethod
    async def write(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        """Write a file into the box, creating parent directories."""

    @abc.abstractmethod
    async def host_url(self, url: str) -> str:
        """The URL at which a program inside the box reaches ``url`` on the host
        (the interception endpoint), setting up any bridge this needs."""

    def plan_routes(self, urls: Sequence[str]) -> None:  # noqa: B027 - an optional hook
        """Told before :meth:`start`: the host URLs (the interception's, as later given to
        :meth:`host_url`) the box will be asked to reach. A runtime that fixes its network
        policy when it creates the box (Modal) allows exactly these then."""

    def plan_tools(self, tools: Sequence[ToolSpec]) -> None:  # noqa: B027 - an optional hook
        """Told before :meth:`start`: the agent programs the harness runs from the node's tool
        dir. Boxes over the node's files see that dir (bwrap and docker mount it read-only); a
        runtime with :attr:`TOOLS_IN_IMAGE` builds them into the box's image."""

    async def prepare_execution(self, routes: Sequence[str]) -> None:  # noqa: B027
        """Apply the task's network policy right before the agent runs, keeping ``routes``
        (the interception and tool URLs, as returned by :meth:`host_url`) reachable."""

    @abc.abstractmethod
    async def alive(self) -> bool:
        """Whether the box is still up."""

    async def limit_hit(self) -> str | None:
        """Which of the box's limits killed a program in it so far (``"memory limit of 2 GB
        (1 program(s) OOM-killed)"``), or None. A failed harness program in a box that hit one
        is a :class:`~vfray.errors.SandboxError` saying so, not the program's fault."""
        return None

    async def run_uv_script(
        self,
        script: str | bytes,
        args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> ProgramResult:
        """Run a PEP 723 script (inline dependencies) with ``uv run --script`` inside the box.

        uv installs the script's dependencies inside the box, so scorer dependencies never touch
        the farm process. uv must be on the box's PATH; its cache lives in the box's work dir. A
        box without network (bwrap/docker default-deny) can only run scripts whose dependencies
        are none or already in that cache (:meth:`prepare_uv_script`, called while the box has
        network): ``UV_OFFLINE`` is set there so uv fails fast instead of retrying."""
        name = await self._write_uv_script(script)
        uv_env = _uv_env(offline=self.isolates_network)
        uv_env.update(env or {})
        return await self.run(
            ["uv", "run", "--quiet", "--no-project", "--script", name, *args],
            uv_env,
            timeout=timeout,
        )

    async def prepare_uv_script(self, script: str | bytes, *, timeout: float | None = None) -> None:
        """Install a PEP 723 script's dependencies into the box's uv cache now (``uv sync
        --script``), so a later :meth:`run_uv_script` of the same script needs no network: a
        task's setup calls it while the box can still reach the index, its reward runs the
        script after the agent's network is cut (v1's ``prepare_uv_script``). A failure is a
        :class:`~vfray.errors.SandboxError` with uv's last line."""
        from vfray.errors import SandboxError

        name = await self._write_uv_script(script)
        result = await self.run(
            ["uv", "sync", "--quiet", "--script", name], _uv_env(offline=False), timeout=timeout
        )
        if not result.ok:
            said = (result.stderr.strip() or result.stdout.strip()).splitlines()
            why = said[-1] if said else f"exit code {result.exit_code}"
            raise SandboxError(f"uv could not install the script's dependencies: {why}")

    async def _write_uv_script(self, script: str | bytes) -> str:
        # Named by content: the script prepared in setup is the one run in scoring.
        data = script if isinstance(script, bytes) else script.encode()
        name = f".vfray/scripts/{hashlib.sha256(data).hexdigest()[:16]}.py"
        await self.write(name, data, mode=0o755)
        return name

    async def __aenter__(self) -> Runtime:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
