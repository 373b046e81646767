"""The run driver's hosts: a :class:`HostPool` that picks a backend's host for each rollout
(least-loaded first, a recently lost host last), and :class:`HostLost`, which a backend raises
when the machinery under a rollout died rather than the rollout."""

from __future__ import annotations

import time
from collections.abc import Sequence


class HostLost(Exception):
    """The machinery under a rollout failed (its host or node died), not the rollout: the
    driver records the attempt and retries it on another host."""


HOST_COOLDOWN_S = 10.0
"""How long a host that was just lost is picked last: Ray restarts a lost actor on another
node, which takes seconds, and retries sent to it meanwhile would be lost again."""

HOST_LOST_BACKOFF_S = 0.5
"""The wait before a lost rollout's next attempt, times the attempt number."""


class HostPool:
    """A backend's hosts by index, picked least-loaded first, and a host lost in the last
    :data:`HOST_COOLDOWN_S` seconds last (unless a rollout on it has finished since)."""

    def __init__(self, count: int) -> None:
        if count < 1:
            raise ValueError("a HostPool needs at least one host")
        self.load = [0] * count
        self._cooling: dict[int, float] = {}  # host → monotonic time its cooldown ends

    def acquire(self, avoid: int | None = None, among: Sequence[int] | None = None) -> int:
        """A host for one rollout, from ``among`` (the hosts whose node fits it) or all."""
        now = time.monotonic()
        self._cooling = {i: end for i, end in self._cooling.items() if end > now}
        order = sorted(
            range(len(self.load)) if among is None else among,
            key=lambda i: (i in self._cooling, i == avoid, self.load[i]),
        )
        index = order[0]
        self.load[index] += 1
        return index

    def release(self, index: int) -> None:
        self.load[index] -= 1

    def lost(self, index: int) -> None:
        """The host failed under a rollout: pick it last for a while."""
        self._cooling[index] = time.monotonic() + HOST_COOLDOWN_S

    def answered(self, index: int) -> None:
        """A rollout on the host finished: it is up again."""
        self._cooling.pop(index, None)
