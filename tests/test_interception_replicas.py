"""More than one interception replica on a node (``farm.interception_replicas_per_node``), on a
real local Ray: the node's SandboxHosts are spread over its replicas, each host's sessions all
go to the replica its boxes' URL points at, and the rollouts run through both."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import vfray as vf
from vfray.farm import Farm
from vfray.tasksets.arithmetic import ArithmeticTaskset


def replica_stats(f: Farm, replica: str) -> dict[str, Any]:
    from ray import serve

    handle = serve.get_deployment_handle("Interception", f._pool.app_name)
    # Routed to that replica by the pool's PinnedRouter.
    stats: dict[str, Any] = handle.stats.remote(replica=replica).result(timeout_s=60)
    return stats


@pytest.mark.usefixtures("ray_local")
def test_two_replicas_on_the_node_serve_the_rollouts_of_their_own_hosts(tmp_path: Path) -> None:
    config = vf.EvalConfig()
    config.farm.interception = "serve"
    config.farm.interception_replicas_per_node = 2
    config.farm.hosts_per_node = 2
    with Farm(
        config=config,
        model="scripted:arithmetic?latency=0.2",
        harness="null",
        runtime="subprocess",
        output_dir=str(tmp_path),
        progress=False,
        max_concurrent=8,
    ) as farm:
        result = farm.run(ArithmeticTaskset(num_tasks=8), rollouts_per_task=2)
        traces = result.traces.to_pylist()
        assert len(traces) == 16
        assert all(row["ok"] for row in traces), [row["error"] for row in traces]
        hosts = farm.host_stats()
        assert len(hosts) == 2
        # Slots 0 and 1 of the node: one replica each, its own listener handed to the boxes.
        replicas = {h["replica"] for h in hosts}
        assert len(replicas) == 2, hosts
        stats = {r: replica_stats(farm, r) for r in replicas}
        for host in hosts:
            mine = stats[host["replica"]]
            assert host["url"] == mine["url"]
            # Every session a host opened is on its replica: none lost, none elsewhere.
            assert mine["opened"] == host["completed"] > 0
            assert mine["sessions"] == 0
        assert sum(s["opened"] for s in stats.values()) == 16
        assert len({s["pid"] for s in stats.values()}) == 2


def test_dry_run_shows_the_replicas_knob(capsys: pytest.CaptureFixture[str]) -> None:
    from tests.test_cli import vfray_here

    code, out, err = vfray_here(
        capsys, "eval", "arithmetic", "--dry-run", "--farm.interception", "serve",
        "--farm.interception-replicas-per-node", "3",
    )  # fmt: skip
    assert code == 0, err
    farm = json.loads(out)["farm"]
    assert farm["interception_replicas_per_node"] == 3
