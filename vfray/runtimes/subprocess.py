"""The ``subprocess`` runtime: each command runs as a local process group in a fresh work dir.

It scrubs the host's secrets from the environment and applies rlimits, but it gives NO isolation:
a harness that executes code can read and write anything the farm process can, and a program that
detaches itself (``setsid env -i …``) escapes the box's cleanup. Use ``bwrap`` or ``docker`` for
untrusted code; a run that pairs a code-executing harness with this runtime is warned about
(:func:`vfray.runtimes.registry.runtime_warnings`). Harness programs start through the launch
throttle (:mod:`vfray.runtimes.launches`), and the box's processes die with their owner process
(:mod:`vfray.runtimes.lifeline`).
"""

from __future__ import annotations

import grp
import os
import pwd
import signal
import sys
import tempfile
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import ClassVar

from vfray.errors import SandboxError
from vfray.runtimes._executor import blocking
from vfray.runtimes._remove import remove_tree
from vfray.runtimes._small_files import Opener, read_file, read_small, write_file, write_small
from vfray.runtimes.base import LiveProcess, ProgramResult, Runtime, RuntimeSpec
from vfray.runtimes.images import refuse_image, runs_images
from vfray.runtimes.launches import Launch, launch_limit, launch_slots
from vfray.runtimes.lifeline import owner_id, reap_dead_owners, watch_root, work_dir_prefix
from vfray.runtimes.live import signal_tree
from vfray.runtimes.processes import (
    OUTPUT_CAP,
    box_env,
    kill_group,
    network_env,
    rlimit_setter,
    run_process_group,
    start_live,
)
from vfray.runtimes.strays import stray_sweeper


def is_node_user(user: str) -> bool:
    """Whether ``user`` (``name``, ``uid``, either with ``:group``) is this process's own."""
    name, _, group = user.partition(":")
    me = pwd.getpwuid(os.getuid())
    if name not in (me.pw_name, str(me.pw_uid)):
        return False
    if not group:
        return True
    try:
        own_group = grp.getgrgid(os.getgid()).gr_name
    except KeyError:
        own_group = str(os.getgid())
    return group in (own_group, str(os.getgid()))


class SubprocessRuntime(Runtime):
    """Local process groups in a temporary work dir. No isolation: trusted harnesses only."""

    type = "subprocess"
    warn_no_isolation: ClassVar[bool] = True
    python = os.path.realpath(sys.executable)
    term_spares: ClassVar[frozenset[str]] = frozenset()
    """Process names a live process's SIGTERM skips (:func:`vfray.runtimes.live.signal_tree`)."""

    def __init__(
        self,
        spec: RuntimeSpec | None = None,
        *,
        cpu_seconds: int | None = None,
        output_cap: int = OUTPUT_CAP,
        root: str | None = None,
        launch_concurrency: int | None = None,
    ) -> None:
        super().__init__(spec)
        self.cpu_seconds = cpu_seconds
        self.output_cap = output_cap
        self.root = root
        self.launch_concurrency = launch_limit(launch_concurrency)
        """Harness programs starting at once per event loop (0: unthrottled); see
        :mod:`vfray.runtimes.launches`."""
        self.box_id = uuid.uuid4().hex[:12]
        self.owner: str | None = None
        self.workdir: Path | None = None
        self._pgids: set[int] = set()
        self._running: set[int] = set()
        """Process groups of the ``run`` calls in progress (:meth:`interrupt`'s targets)."""
        self._stopped = False

    async def start(self) -> None:
        if self.spec.image is not None and not runs_images(type(self)):
            # Never run an image task on the host's own filesystem as if it had its image.
            from vfray.runtimes.registry import image_runtimes

            raise SandboxError(refuse_image(self.type, image_runtimes()))
        try:
            self.owner = owner_id()
            root = watch_root(self.root)
        except OSError as exc:
            raise SandboxError(f"cannot start the owner's watchdog: {exc}") from exc
        await reap_dead_owners(root)
        try:
            prefix = work_dir_prefix(self.type, self.owner)
            base = Path(await blocking(tempfile.mkdtemp, prefix=prefix, dir=root))
        except OSError as exc:
            raise SandboxError(f"cannot create work dir: {exc}") from exc
        self.workdir = base

    def _require_workdir(self) -> Path:
        if self.workdir is None or self._stopped:
            raise SandboxError(f"{self.type} runtime is not started")
        return self.workdir

    def resolve(self, path: str) -> Path:
        """A box path on the host: relative paths are under the work dir."""
        return self._require_workdir() / path

    async def run(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        *,
        timeout: float | None = None,
        stdin: bytes | None = None,
        user: str | None = None,
    ) -> ProgramResult:
        return await self._run(argv, env, timeout=timeout, stdin=stdin, user=user)

    async def run_program(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        *,
        timeout: float | None = None,
        signals_ready: bool = False,
    ) -> ProgramResult:
        launch = Launch(launch_slots(self.launch_concurrency), signals_ready)
        user = await self.program_user_ready()
        return await self._run(argv, env, timeout=timeout, launch=launch, user=user)

    async def program_user_ready(self) -> str | None:
        # Nothing to hand over: the box's files are the node user's, whom this runtime's
        # programs run as (another user is refused by _command), and whom bwrap's user
        # namespace maps its user onto.
        return self.program_user

    def _command(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None,
        cwd: str | None = None,
        serve: str | None = None,
        user: str | None = None,
    ) -> tuple[list[str], dict[str, str], str, Callable[[], None] | None]:
        """How the host starts ``argv`` in this box: full argv, environment, host cwd, and
        the child's pre-exec hook (limits). ``serve``: see :meth:`_serve_socket`. ``user``:
        the node's own user only (this runtime cannot switch users)."""
        if user is not None and not is_node_user(user):
            raise SandboxError(
                f"the {self.type} runtime runs programs as the node's user and cannot run one "
                f"as {user!r}; use bwrap, docker or podman"
            )
        workdir = self._require_workdir()
        return (
            list(argv),
            box_env(
                os.environ,
                str(workdir),
                self.box_id,
                {**network_env(os.environ), **(env or {})},
                owner=self.owner,
            ),
            str(workdir / cwd) if cwd else str(workdir),
            rlimit_setter(self.spec.memory_gb, self.cpu_seconds, self.spec.pids),
        )

    async def _run(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None,
        *,
        timeout: float | None,
        stdin: bytes | None = None,
        launch: Launch | None = None,
        user: str | None = None,
    ) -> ProgramResult:
        command, penv, cwd, preexec = self._command(argv, env, user=user)
        started: list[int] = []

        def on_start(pgid: int) -> None:
            self._pgids.add(pgid)
            self._running.add(pgid)
            started.append(pgid)

        try:
            return await run_process_group(
                command,
                penv,
                cwd,
                timeout=timeout,
                stdin=stdin,
                preexec_fn=preexec,
                on_start=on_start,
                output_cap=self.output_cap,
                launch=launch,
            )
        finally:
            self._running.difference_update(started)

    async def interrupt(self) -> int:
        reached = 0
        for pgid in list(self._running):
            signalled = await blocking(signal_tree, pgid, signal.SIGTERM, self.term_spares)
            reached += signalled > 0
        return reached

    async def open_process(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> LiveProcess:
        serve = self._serve_socket()
        user = await self.program_user_ready()
        command, penv, host_cwd, preexec = self._command(argv, env, cwd, serve, user=user)
        process = await start_live(
            command, penv, host_cwd, preexec_fn=preexec, spare=self.term_spares
        )
        assert process.pid is not None
        self._pgids.add(process.pid)
        self._opened(process, serve)
        return self.track(process)

    def _serve_socket(self) -> str | None:
        """A box with its own network gives each live process a way in for :meth:`expose`
        (the name of its forwarder's socket); this one shares the host's."""
        return None

    def _opened(self, process: LiveProcess, serve: str | None) -> None:
        """Called with each live process started and its :meth:`_serve_socket`."""

    async def expose(self, port: int) -> str:
        self._require_workdir()
        return f"http://127.0.0.1:{port}"

    def opener(self, path: str) -> Opener:
        """How the host opens the box's ``path`` (:meth:`resolve`'s host path; parent dirs made
        for a write). A box of its own confines this to its dirs (bwrap)."""
        target = self.resolve(path)

        def open_(flags: int, mode: int) -> int:
            if flags & os.O_CREAT:
                target.parent.mkdir(parents=True, exist_ok=True)
            return os.open(target, flags, mode)

        return open_

    async def read(self, path: str) -> bytes:
        opener = self.opener(path)
        try:
            small = read_small(opener)
            return small if small is not None else await blocking(read_file, opener)
        except OSError as exc:
            raise SandboxError(f"cannot read {path!r}: {exc}") from exc

    async def write(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        opener = self.opener(path)
        try:
            if not write_small(opener, data, mode):
                await blocking(write_file, opener, data, mode)
        except OSError as exc:
            raise SandboxError(f"cannot write {path!r}: {exc}") from exc

    async def host_url(self, url: str) -> str:
        return url

    async def alive(self) -> bool:
        return self.workdir is not None and not self._stopped and self.workdir.is_dir()

    def _emptied(self) -> bool:
        """Whether every process the box ran is dead already, killed through a container that
        none of them could leave: then the /proc marker sweep (~3 ms of CPU a box, two walks
        reading every process's environment) is skipped."""
        return False

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        await self.end_processes()
        for pgid in self._pgids:
            kill_group(pgid)
        # The marker sweep reads every /proc/*/environ: off the event loop, which also serves
        # the interception in a SandboxHost. Twice: a stray may be mid-fork during the first.
        if not self._emptied():
            await stray_sweeper().sweep(self.box_id)
        self._pgids.clear()
        if self.workdir is not None:
            await blocking(remove_tree, self.workdir)
