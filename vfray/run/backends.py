"""The farm-lifetime backend seam: what ``Farm`` asks of a backend between its start and its
close (start the machinery, open one run, stats, the policy version, release). The per-run seam
the driver talks to is :class:`~vfray.run.driver.RunBackend`; each farm backend opens one of
those per run. Implemented in this process by :class:`~vfray.run.local.LocalFarm` and on Ray by
``actors.ray_farm.RayFarm``.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, Protocol

from vfray.run.driver import RunBackend
from vfray.task import Task


class FarmBackend(Protocol):
    """Built with the farm's :class:`~vfray.run.spec.RunSpec`; starts nothing until asked."""

    def start(self) -> None:
        """Start the machinery (Ray, hosts, the model endpoint) on the caller's thread; a
        second call does nothing."""
        ...

    def open_run(
        self, run_dir: Path, header: dict[str, Any]
    ) -> AbstractAsyncContextManager[RunBackend]:
        """One run's backend; on the way out every buffered row is written (also when the run
        fails or is cancelled) and the run's own resources are released."""
        ...

    def prepare(self, task: Task[Any]) -> None:
        """Called once per task class before its first rollout (Ray ships classes that only
        exist in this process)."""
        ...

    def stats(self) -> list[dict[str, Any]]:
        """Per host: node, pid, rollouts in flight and completed, live sessions."""
        ...

    def set_policy_version(self, version: int | None) -> None:
        """Stamp ``version`` on every ModelCall from now on (also on hosts started later)."""
        ...

    def interrupt(self) -> None:
        """Cancel the run in progress from any thread, before :meth:`close`."""
        ...

    def close(self) -> None:
        """Cancel every rollout (tearing its box down) and release the machinery."""
        ...
