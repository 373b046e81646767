"""Warm bwrap boxes: a stopped box's dir, cgroups and network namespace kept for the next
rollout of the same box spec instead of torn down and made again.

A box is parked only once nothing of its rollout is left (:func:`renew_dirs` after the caller
emptied its cgroups): every process killed through its cgroups, which none of its programs can
leave; its listeners and bridges closed; its writable dirs (work dir, which is also its home,
``/tmp`` and the bridge dir) removed and made again empty, so their modes and extended
attributes are new too. What is kept holds nothing a program could write: the cgroups (their
OOM count is read at each take, so a rollout sees only its own), the namespace (a program in the
box has no capability over it, so its interfaces, routes and sysctls are the owner's; its
sockets died with their programs; the owner's thread that makes listeners in it stays too) and
the box's bwrap mounts, computed once, and its egress gate (:mod:`vfray.runtimes.egress`),
whose connections are cut at park and whose policy is back to the setup phase's at each take;
the policy itself is the spec's, which the pool keys on.

One pool per process, bounded per spec (:attr:`BwrapRuntime.warm_boxes`), emptied at exit; a
forked child never takes its parent's boxes. A box the owner never got back (the owner killed)
is reaped like any other: its dir and cgroups carry the owner's token.
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from vfray.runtimes._box_netns import BoxNetns
from vfray.runtimes._cgroup_v1 import CgroupV1
from vfray.runtimes._executor import blocking
from vfray.runtimes._remove import remove_tree
from vfray.runtimes.egress import EgressGate

WARM_BOXES = 8
"""Stopped boxes kept per box spec and process, by default."""
WRITABLE = ("work", "tmp", "bridge")
"""A host-root box's dirs under its base that its programs can write."""


@dataclass
class Parked:
    """What a warm box keeps between rollouts."""

    base: Path
    owner: str | None
    cgroup: CgroupV1
    netns: BoxNetns
    prefix: list[str] = field(default_factory=list)
    gate: EgressGate | None = None
    """Kept with its listener in the namespace (it makes no socket of its own)."""

    def destroy(self) -> None:
        """Everything it holds let go (blocking; its cgroups hold no process)."""
        self.cgroup.remove()
        if self.gate is not None:
            self.gate.release()
        self.netns.release()
        remove_tree(self.base)


def renew_dirs(base: Path, names: Sequence[str] = WRITABLE) -> bool:
    """Each of ``names`` under ``base`` removed and made again, empty (mode 0777); False when
    one could not be (the box is then not reused). Blocking."""
    for name in names:
        path = base / name
        remove_tree(path)
        try:
            path.mkdir(mode=0o777)
            os.chmod(path, 0o777)  # past the umask
        except OSError:
            return False
    return True


class BoxPool:
    """Parked boxes by spec key, at most ``limit`` per key (the caller's)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._parked: dict[str, list[Parked]] = {}

    def _mine(self) -> bool:
        """False in a forked child: the parked boxes are its parent's, never touched here."""
        if self._pid != os.getpid():
            self._parked = {}
            self._pid = os.getpid()
            return False
        return True

    def take(self, key: str, owner: str | None) -> Parked | None:
        """A parked box of ``key`` for ``owner`` (this process's token), or None."""
        stale: list[Parked] = []
        found = None
        with self._lock:
            if not self._mine():
                return None
            boxes = self._parked.get(key, [])
            while boxes and found is None:
                box = boxes.pop()
                if box.owner == owner and box.base.is_dir():
                    found = box
                else:
                    stale.append(box)
        for box in stale:
            box.destroy()
        return found

    def park(self, key: str, box: Parked, limit: int) -> bool:
        """Keep ``box`` for ``key`` when fewer than ``limit`` are kept; whether it was."""
        with self._lock:
            if not self._mine():
                return False
            boxes = self._parked.setdefault(key, [])
            if len(boxes) >= limit:
                return False
            boxes.append(box)
            return True

    async def reset_and_park(
        self, key: str, box: Parked, limit: int, close_ways: Callable[[], Awaitable[None]]
    ) -> bool:
        """Keep the stopped ``box`` for ``key`` once emptied of its rollout: every process in
        its cgroups killed, its ways in closed (``close_ways``, then its namespace's
        listeners but its gate's, which is out of use), its writable dirs made again.
        False when the pool is full or the box could not be emptied: the caller tears it
        down."""
        if self.count(key) >= limit or not await box.cgroup.empty():
            return False
        await close_ways()
        if box.gate is not None:
            box.gate.release()
        box.netns.stop_listening(keep=[box.gate.port] if box.gate is not None else [])
        if not await blocking(renew_dirs, box.base):
            return False
        return self.park(key, box, limit)

    def count(self, key: str | None = None) -> int:
        with self._lock:
            if key is not None:
                return len(self._parked.get(key, []))
            return sum(len(boxes) for boxes in self._parked.values())

    def close(self) -> None:
        """Let every parked box go (at exit, or by a caller that is done with boxes)."""
        with self._lock:
            if not self._mine():
                return
            boxes = [box for kept in self._parked.values() for box in kept]
            self._parked.clear()
        for box in boxes:
            box.destroy()


POOL = BoxPool()
atexit.register(POOL.close)
