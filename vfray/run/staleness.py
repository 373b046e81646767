"""Bounded staleness for training streams: how many policy versions old a group is, and the
task source that lets a stale group's task run again.

A trainer that samples while it trains (asynchronous RL) sets the policy version after each
step (:meth:`vfray.Farm.set_policy_version`); every model call is stamped with the version in
force when it was made. ``Farm.stream(max_staleness=k)`` then refuses a group whose oldest call
is more than ``k`` versions behind the trainer's current one when it arrives (prime-rl's
``max_async_level``): dropped, or run again at the current weights (``on_stale``).

Internal: importable, but not the public API (:mod:`vfray`, :mod:`vfray.testing`,
:mod:`vfray.train`, :mod:`vfray.compat.v1`); names here may move.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

from vfray.run.outcomes import EpisodeGroup
from vfray.task import Task

ON_STALE = ("drop", "rerun")
MAX_RERUNS = 3
"""Times one task is run again for staleness before its group is dropped after all (a trainer
that outpaces every run of a group would otherwise loop on it)."""


def group_staleness(group: EpisodeGroup, current: int | None) -> int | None:
    """How many versions the group's oldest answered call is behind ``current`` (None when no
    version is set, or the group made no call). A call made before any version was set counts
    as version 0."""
    if current is None:
        return None
    versions = [
        call.policy_version if call.policy_version is not None else 0
        for trace in group.traces
        for call in trace.calls
        if call.response_id is not None
    ]
    if not versions:
        return None
    return current - min(versions)


class Requeue(Iterator[Task[Any]]):
    """A task source that yields the tasks queued again (stale groups' tasks) before new ones,
    and remembers the tasks in flight by key so a stale group's task can be found again."""

    def __init__(self, source: Iterable[Task[Any]]) -> None:
        self._source = iter(source)
        self._queued: deque[Task[Any]] = deque()
        self._live: dict[str, Task[Any]] = {}
        self._reruns: dict[str, int] = {}

    def __next__(self) -> Task[Any]:
        task = self._queued.popleft() if self._queued else next(self._source)
        self._live[task.key] = task
        return task

    def finished(self, key: str) -> None:
        """The group of ``key`` was delivered (or dropped for good): forget its task."""
        self._live.pop(key, None)
        self._reruns.pop(key, None)

    def rerun(self, key: str) -> bool:
        """Queue the task of ``key`` again; False when it was run again too often already."""
        task = self._live.pop(key, None)
        count = self._reruns.get(key, 0)
        if task is None or count >= MAX_RERUNS:
            self._reruns.pop(key, None)
            return False
        self._reruns[key] = count + 1
        self._queued.append(task)
        return True

    @property
    def queued(self) -> bool:
        """Tasks wait to run again (after the source ran out, the run makes another pass)."""
        return bool(self._queued)
