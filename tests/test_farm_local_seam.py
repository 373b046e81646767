"""``Farm`` over the in-process farm backend (:class:`vfray.run.local.LocalFarm`), without Ray:
the seam's stats and policy version follow the run in progress, and a run's own endpoint and
interception are gone when it ends."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import vfray as vf
from vfray.run.local import LocalFarm
from vfray.tasksets.arithmetic import EndlessArithmetic


def test_stats_and_policy_version_follow_the_local_run_in_progress(tmp_path: Path) -> None:
    async def consume(farm: vf.Farm) -> tuple[list[list[int | None]], list[dict[str, object]]]:
        versions: list[list[int | None]] = []
        stats: list[dict[str, object]] = []
        farm.set_policy_version(1)
        async for group in farm.stream(EndlessArithmetic().head(4), rollouts_per_task=2):
            versions.append(sorted({c.policy_version for t in group.traces for c in t.calls}))
            stats = farm.host_stats()
            farm.set_policy_version(2)  # the trainer's next step: later calls carry it
        return versions, stats

    with vf.Farm(
        "scripted:arithmetic?latency=0.05",
        harness="null",
        backend="local",
        max_concurrent=2,
        output_dir=str(tmp_path),
        progress=False,
    ) as farm:
        assert isinstance(farm._backend, LocalFarm)
        assert farm.host_stats() == []  # nothing runs between runs
        versions, stats = asyncio.run(consume(farm))
        assert farm.host_stats() == []
    assert versions[0] == [1] and versions[-1] == [2]
    assert len(stats) == 1 and stats[0]["node_id"] == "local"
    assert str(stats[0]["url"]).startswith("http://127.0.0.1:")


def test_a_closed_farm_refuses_new_runs(tmp_path: Path) -> None:
    farm = vf.Farm(harness="null", backend="local", output_dir=str(tmp_path), progress=False)
    farm.close()
    with pytest.raises(RuntimeError, match="closed"):
        farm.run(EndlessArithmetic().head(1))
