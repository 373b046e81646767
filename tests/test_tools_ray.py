"""Toolsets on the Ray backend: a shared toolset is one instance per node (the node's
ToolsetNode actor, whatever the SandboxHosts on it) with each rollout's state its own; the
scratchpad per rollout on the host and in the box; a server that cannot start fails only its
own rollout; ``bwrap`` boxes without network reach both; a harness without MCP is refused."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

import vfray as vf
from examples.tools_glossary import GlossaryTaskset
from examples.tools_scratchpad import ScratchpadTaskset
from tests.fixtures.tool_sets import ToolTask, census_tasks
from vfray.errors import IncompatibleError
from vfray.farm import Farm
from vfray.tools import McpServer
from vfray.traces.convert import table_to_traces

pytestmark = pytest.mark.usefixtures("ray_local")

ROOT = str(Path(__file__).resolve().parents[1])


def _server(trace: vf.Trace) -> str:
    return trace.tool_calls[0].server if trace.tool_calls else ""


def _census(traces: list[vf.Trace]) -> set[str]:
    """The instances that answered; each rollout's total is its own number twice."""
    instances = set()
    for trace in traces:
        assert trace.errors == []
        add1, who, add2 = trace.tool_calls
        n = add1.arguments["n"]
        assert (add1.result, add2.result) == (str(n), str(2 * n))
        assert who.result is not None
        instances.add(who.result)
    return instances


def _farm(tmp_path: Path, harness: str = "bash", **kw: Any) -> Farm:
    return Farm(
        model="scripted:agent",
        harness=harness,
        output_dir=str(tmp_path),
        progress=False,
        max_concurrent=8,
        **kw,
    )


def test_shared_toolset_is_one_per_node_and_per_rollout_ones_are_apart(tmp_path: Path) -> None:
    """Two hosts on the one node: one shared instance (in neither host's process), every
    rollout's state its own; the per-rollout scratchpad on the host and in the box; a server
    that cannot start is a setup ToolError on its own rollout only."""
    broken = ToolTask(
        vf.TaskData(prompt="tool: noop"), [McpServer(name="gone", command=("false",))]
    )
    tasks = [
        *census_tasks(4),
        *GlossaryTaskset().load()[:2],
        *ScratchpadTaskset().load()[:2],
        *ScratchpadTaskset(in_box=True).load()[2:],
        broken,
    ]
    with _farm(tmp_path, runtime="subprocess", hosts=2, host_concurrency=4) as farm:
        result = farm.run(tasks, rollouts_per_task=2)
        hosts = farm.host_stats()
        (node,) = farm._backend.toolset_nodes.stats()  # type: ignore[attr-defined]
    traces = table_to_traces(result.final_traces)
    assert len(traces) == 2 * len(tasks)
    by_server: dict[str, list[vf.Trace]] = {}
    for trace in traces:
        by_server.setdefault(_server(trace), []).append(trace)

    assert len({h["pid"] for h in hosts}) == 2 and all(h["completed"] > 0 for h in hosts)
    (instance,) = _census(by_server["census"])
    assert len(by_server["census"]) == 8
    pid = int(instance.split("/")[0])
    assert pid == node["pid"] and pid not in {h["pid"] for h in hosts}
    assert node["bindings"] == 0  # every rollout's binding went with it

    for trace in by_server["glossary"]:
        assert trace.errors == [] and trace.metrics["own_lookups"] == 1.0
    assert len(by_server["scratchpad"]) == 8
    for trace in by_server["scratchpad"]:
        assert trace.errors == [] and trace.rewards["remembered"].value == 1.0

    failed = by_server[""]
    assert len(failed) == 2
    for trace in failed:
        assert [(e.type, e.phase) for e in trace.errors] == [("ToolError", "setup")]
        assert "'gone'" in (trace.errors[0].message or "") and trace.calls == []


@pytest.mark.bwrap
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
def test_bwrap_boxes_on_ray_reach_shared_host_and_in_box_tools(tmp_path: Path) -> None:
    """Default-deny egress on Ray: the node's shared toolsets and a host binding through the
    bridge, the in-box scratchpad through the box's own expose."""
    config = vf.EvalConfig()
    config.env.runtime.options = {"ro_binds": [ROOT]}
    tasks = [
        *census_tasks(2),
        *GlossaryTaskset().load()[:1],
        *ScratchpadTaskset().load()[:1],
        *ScratchpadTaskset(in_box=True).load()[1:2],
    ]
    with _farm(tmp_path, runtime="bwrap", config=config) as farm:
        result = farm.run(tasks, rollouts_per_task=1)
    traces = table_to_traces(result.final_traces)
    assert len(traces) == len(tasks)
    assert len(_census([t for t in traces if _server(t) == "census"])) == 1
    for trace in traces:
        assert trace.errors == []
        assert all(r.value == 1.0 for r in trace.rewards.values())


def test_a_harness_without_mcp_is_refused_on_ray_before_anything_runs(tmp_path: Path) -> None:
    with _farm(tmp_path, "null", runtime="subprocess") as farm:
        with pytest.raises(IncompatibleError, match="cannot use MCP tools"):
            farm.run(ScratchpadTaskset(), rollouts_per_task=1)
        assert all(h["completed"] == 0 for h in farm.host_stats())
