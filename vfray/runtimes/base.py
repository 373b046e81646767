"""The :class:`Runtime` contract: the box a harness runs in, whatever it is made of.

Every implementation (subprocess, bwrap, docker, modal) passes
``vfray.testing.check_runtime``. ``stop`` is idempotent and always called by the rollout.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from vfray.task import TaskData


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
    workdir: str | None = None
    cpu: float = 1.0
    memory_gb: float | None = None
    pids: int | None = 512
    network_allow: tuple[str, ...] = ("*",)
    network_block: tuple[str, ...] = ()

    @classmethod
    def from_task(cls, data: TaskData) -> RuntimeSpec:
        return cls(
            image=data.image,
            workdir=data.workdir,
            cpu=data.resources.cpu,
            memory_gb=data.resources.memory,
            network_allow=tuple(data.network_allow),
            network_block=tuple(data.network_block),
        )


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
    python: str = "python3"
    """How a harness starts Python in this box. Boxes over the host's filesystem use the
    host's real interpreter: a version-manager shim (pyenv) costs ~0.5 s per launch."""

    def __init__(self, spec: RuntimeSpec | None = None) -> None:
        self.spec = spec or RuntimeSpec()

    @classmethod  # noqa: B027 - an optional hook
    def preflight(cls, options: dict[str, Any]) -> None:
        """Check once, before any rollout, that boxes can start here with these constructor
        ``options`` (an engine reachable, a binary that works, an SDK installed). Raises
        :class:`vfray.errors.ConfigError` with one line saying what is wrong and how to fix
        it."""

    @abc.abstractmethod
    async def start(self) -> None:
        """Create the box. Raises :class:`vfray.errors.SandboxError` when it cannot."""

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
    ) -> ProgramResult:
        """Run a command to completion inside the box."""

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
        (:mod:`vfray.runtimes.launches`) holds the program's launch slot until then."""
        return await self.run(argv, env, timeout=timeout)

    @abc.abstractmethod
    async def read(self, path: str) -> bytes:
        """Read a file from the box."""

    @abc.abstractmethod
    async def write(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        """Write a file into the box, creating parent directories."""

    @abc.abstractmethod
    async def host_url(self, url: str) -> str:
        """The URL at which a program inside the box reaches ``url`` on the host
        (the interception endpoint), setting up any bridge this needs."""

    async def prepare_execution(self, routes: Sequence[str]) -> None:  # noqa: B027
        """Apply the task's network policy right before the agent runs, keeping ``routes``
        (the interception and tool URLs, as returned by :meth:`host_url`) reachable."""

    @abc.abstractmethod
    async def alive(self) -> bool:
        """Whether the box is still up."""

    async def run_uv_script(
        self,
        script: str,
        args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> ProgramResult:
        """Run a PEP 723 script (inline dependencies) with ``uv run`` inside the box."""
        from vfray.runtimes.uv import run_uv_script

        return await run_uv_script(self, script, args, env=env, timeout=timeout)

    async def __aenter__(self) -> Runtime:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
