"""The interception as a Ray Serve deployment (``farm.interception = "serve"``) on a real local
Ray: rollouts record their turns through the node's replica, the replica's listener is its own
(direct ingress, no Serve proxy), and a replica killed mid-run costs its node's in-flight
rollouts one retry each — the lost attempts stay as rows, nothing is lost or written twice."""

from __future__ import annotations

import asyncio
import os
import signal
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import vfray as vf
from vfray.farm import Farm
from vfray.tasksets.arithmetic import ArithmeticTaskset

pytestmark = pytest.mark.usefixtures("ray_local")


def serve_farm(out: Path, **kw: Any) -> Farm:
    config = vf.EvalConfig()
    config.farm.interception = "serve"
    config.farm.hosts_per_node = 2
    options: dict[str, Any] = {
        "config": config,
        "model": "scripted:arithmetic",
        "harness": "null",
        "runtime": "subprocess",
        "output_dir": str(out),
        "progress": False,
        "max_concurrent": 8,
    }
    options.update(kw)
    return Farm(**options)


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Farm]:
    """One serve-mode farm for the module: Serve and its replica start once."""
    from tests.conftest import start_local_ray

    start_local_ray()
    f = serve_farm(tmp_path_factory.mktemp("serve"), model="scripted:arithmetic?latency=0.3")
    f._start()
    try:
        yield f
    finally:
        f.close()


def replica_stats(f: Farm) -> dict[str, Any]:
    from ray import serve

    handle = serve.get_deployment_handle("Interception", f._pool.app_name)
    stats: dict[str, Any] = handle.stats.remote().result(timeout_s=60)
    return stats


def test_rollouts_record_their_turns_through_the_node_replica(farm: Farm) -> None:
    result = farm.run(ArithmeticTaskset(num_tasks=6), rollouts_per_task=2)
    traces = result.traces.to_pylist()
    assert len(traces) == 12
    assert all(row["ok"] for row in traces)
    assert all(row["num_calls"] >= 1 for row in traces)  # each turn was recorded remotely
    stats = replica_stats(farm)
    assert len(farm.host_stats()) == 2  # farm.hosts_per_node
    assert stats["sessions"] == 0  # every session was concluded
    assert stats["pid"] not in {h["pid"] for h in farm.host_stats()}  # its own process
    # Every host on the node hands its boxes the replica's own listener (direct ingress).
    assert {h["url"] for h in farm.host_stats()} == {stats["url"]}
    with urllib.request.urlopen(stats["url"].removesuffix("/v1") + "/health") as r:
        assert r.status == 200


def test_policy_version_reaches_the_replica(farm: Farm) -> None:
    farm.set_policy_version(7)
    try:
        result = farm.run(ArithmeticTaskset(num_tasks=2), rollouts_per_task=2)
    finally:
        farm.set_policy_version(None)
    assert result.traces.column("policy_version").to_pylist() == [7] * 4


@pytest.mark.slow
def test_killed_replica_retries_its_rollouts_without_loss_or_duplicates(farm: Farm) -> None:
    before = replica_stats(farm)

    async def chaos() -> Any:
        run = asyncio.ensure_future(
            farm.run_async(ArithmeticTaskset(num_tasks=16), rollouts_per_task=2)
        )
        for _ in range(1200):  # until the replica holds sessions: rollouts are in flight
            await asyncio.sleep(0.05)
            if (await asyncio.to_thread(replica_stats, farm))["sessions"] >= 2:
                break
        os.kill(before["pid"], signal.SIGKILL)
        return await run

    result = asyncio.run(chaos())
    after = replica_stats(farm)
    assert after["pid"] != before["pid"] and after["incarnation"] != before["incarnation"]
    final = result.final_traces
    assert final.num_rows == 32
    failed = [(r["error_type"], r["error_message"]) for r in final.to_pylist() if not r["ok"]]
    assert not failed
    rows = result.traces.to_pylist()
    lost = [r for r in rows if r["error_type"] == "InterceptionError"]
    assert lost, "the replica held sessions when it died; their lost attempts are rows"
    assert len(rows) == 32 + len(lost)
    attempts = [(r["task_key"], r["rollout_index"], r["attempt"]) for r in rows]
    assert len(set(attempts)) == len(attempts)
