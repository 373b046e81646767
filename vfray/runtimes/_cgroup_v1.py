"""A bwrap box's cgroup v1 limits: one cgroup per box in each writable controller (memory,
cpu, pids), joined by its programs before exec, read for OOM kills, emptied and removed at stop.

A program joins through :meth:`CgroupV1.join_argv`, a ``/bin/sh`` that moves itself into each
cgroup and then execs the program, not through a ``preexec_fn``: that forces a full ``fork()`` of
the owner instead of ``vfork``, and with the writes it cost ~16 ms per spawn from a 37 MB process
on this machine against ~3 ms through the shell (a Ray actor forks slower still). The shell
writes ``0`` (itself) to ``tasks``, not its pid to ``cgroup.procs``: for a task moving itself
alone the kernel skips the global threadgroup lock, whose write side waits for an RCU grace
period whenever no migration happened just before (measured after 0.2 s idle: 12-16 ms for the
three ``cgroup.procs`` writes, against 0.1 ms each for memory and pids and ~3 ms for cpu through
``tasks``). The shell has one thread, so moving it moves the whole process.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
from pathlib import Path

from vfray.runtimes.base import RuntimeSpec
from vfray.runtimes.processes import kill_pids

CGROUP_ROOT = Path("/sys/fs/cgroup")


class CgroupV1:
    """One box's cgroup in each writable v1 controller (memory, cpu, pids)."""

    def __init__(self, name: str, spec: RuntimeSpec) -> None:
        self.dirs: list[Path] = []
        limits: dict[str, dict[str, float | int | None]] = {
            "memory": {"memory.limit_in_bytes": spec.memory_gb and int(spec.memory_gb * 1024**3)},
            "cpu": {
                "cpu.cfs_period_us": 100_000,
                "cpu.cfs_quota_us": int(spec.cpu * 100_000) if spec.cpu > 0 else None,
            },
            "pids": {"pids.max": spec.pids},
        }
        for controller, files in limits.items():
            directory = CGROUP_ROOT / controller / name
            try:
                directory.mkdir()
            except OSError:
                continue
            self.dirs.append(directory)
            for file, value in files.items():
                if value:
                    (directory / file).write_text(str(value))

    def join_argv(self) -> list[str]:
        """An argv prefix that joins the cgroups and execs the rest of the argv in the same
        process (a failed join exits with the shell's message, running nothing)."""
        joins = " && ".join(
            f"echo 0 > {shlex.quote(str(directory / 'tasks'))}" for directory in self.dirs
        )
        return ["/bin/sh", "-c", f'{joins} && exec "$@"', "sh"]

    def oom_kills(self) -> int:
        """How many programs the kernel killed in this cgroup for going past its memory limit
        (``oom_kill`` in ``memory.oom_control``, Linux 4.13+; 0 without a memory cgroup)."""
        for directory in self.dirs:
            if directory.parent.name != "memory":
                continue
            with contextlib.suppress(OSError, ValueError):
                for line in (directory / "memory.oom_control").read_text().splitlines():
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        return 0

    def pids(self) -> set[int]:
        found: set[int] = set()
        for directory in self.dirs:
            with contextlib.suppress(OSError):
                found.update(int(p) for p in (directory / "cgroup.procs").read_text().split())
        return found

    async def empty(self) -> bool:
        """Kill everything inside, waiting (up to ~2 s) until none is left; whether none is."""
        for _ in range(400):
            members = self.pids()
            if not members:
                return True
            kill_pids(sorted(members))
            # A killed process leaves the cgroup only once the kernel has torn it down.
            await asyncio.sleep(0.005)
        return not self.pids()

    async def destroy(self) -> None:
        """Kill everything inside, then remove the cgroups (retrying while members exit)."""
        await self.empty()
        self.remove()

    def remove(self) -> None:
        """Remove the (empty) cgroups; one with a member left stays."""
        for directory in self.dirs:
            with contextlib.suppress(OSError):
                directory.rmdir()
