"""A shared toolset on a 2-node Ray cluster (``ray.cluster_utils.Cluster``): one instance per
node, in that node's ToolsetNode actor, each rollout's state its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.tool_sets import census_tasks
from vfray.farm import Farm
from vfray.traces.convert import table_to_traces


@pytest.mark.slow
@pytest.mark.usefixtures("ray_fresh")
def test_shared_toolset_is_one_instance_per_node_on_two_nodes(tmp_path: Path) -> None:
    import ray
    from ray.cluster_utils import Cluster

    from actors._local_ray import worker_system_config

    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "node_ip_address": "127.0.0.1",
            "include_dashboard": False,
            "_system_config": worker_system_config(),
        },
    )
    cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
    cluster.wait_for_nodes()
    try:
        with Farm(
            model="scripted:agent",
            harness="bash",
            runtime="subprocess",
            address=cluster.address,
            hosts=2,
            output_dir=str(tmp_path),
            progress=False,
            max_concurrent=8,
        ) as farm:
            result = farm.run(census_tasks(6), rollouts_per_task=2)
            hosts = farm.host_stats()
            nodes = farm._backend.toolset_nodes.stats()  # type: ignore[attr-defined]
    finally:
        ray.shutdown()
        cluster.shutdown()
    assert len({n["node_id"] for n in nodes}) == len(nodes) == 2  # one actor per node
    instances = set()
    for trace in table_to_traces(result.final_traces):
        assert trace.errors == []
        add1, who, add2 = trace.tool_calls
        n = add1.arguments["n"]
        assert (add1.result, add2.result) == (str(n), str(2 * n))
        instances.add(who.result)
    # Every answer came from a node's actor: one instance per node, each host on its own node.
    assert {int(str(i).split("/")[0]) for i in instances} <= {n["pid"] for n in nodes}
    assert len(instances) == len({h["node_id"] for h in hosts if h["completed"]}) == 2
