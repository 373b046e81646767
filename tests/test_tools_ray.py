"""Toolsets on the Ray backend: the shared glossary served by each SandboxHost's loop, the
scratchpad per rollout; every rollout's calls on its own row, its state its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from examples.tools_glossary import GlossaryTaskset
from vfray.farm import Farm
from vfray.traces.convert import table_to_traces

pytestmark = pytest.mark.usefixtures("ray_local")


def test_shared_toolset_on_ray_keeps_rollouts_apart(tmp_path: Path) -> None:
    with Farm(
        model="scripted:agent",
        harness="bash",
        runtime="subprocess",
        output_dir=str(tmp_path),
        progress=False,
        max_concurrent=8,
    ) as farm:
        result = farm.run(GlossaryTaskset(), rollouts_per_task=2)
    traces = table_to_traces(result.final_traces)
    assert len(traces) == 8
    for trace in traces:
        assert trace.errors == []
        assert [c.name for c in trace.tool_calls] == ["define", "lookups", "define"]
        assert trace.metrics["own_lookups"] == 1.0
        assert trace.rewards["defined"].value == 1.0
