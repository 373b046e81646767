"""A refused call stops the agent with ``farm.interception = "serve"`` as it does in host mode:
the refusal is recorded in the node's replica, which tells the rollout's host (a waiting Serve
call per session), so the program that would retry the refusal for ever is stopped at once,
on a real local Ray."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import vfray as vf
from vfray.farm import Farm
from vfray.rollout import Timeouts
from vfray.tasksets.arithmetic import ArithmeticTaskset

pytestmark = pytest.mark.usefixtures("ray_local")

STUBBORN = f"{Path(__file__).parent / 'fixtures' / 'stubborn_agent.py'}:StubbornHarness"
AGENT_BUDGET = 20.0


@pytest.mark.slow
def test_a_refused_call_stops_a_retrying_agent_through_the_serve_pool(tmp_path: Path) -> None:
    from tests.conftest import start_local_ray

    start_local_ray()
    config = vf.EvalConfig()
    config.farm.interception = "serve"
    config.env.max_turns = 1
    config.env.timeouts = Timeouts(agent=AGENT_BUDGET, stop_grace=2.0)
    with Farm(
        config=config,
        model="scripted:arithmetic",
        harness=STUBBORN,
        runtime="subprocess",
        output_dir=str(tmp_path),
        progress=False,
    ) as farm:
        result = farm.run(ArithmeticTaskset(num_tasks=2), rollouts_per_task=2)
    rows = result.final_traces.to_pylist()
    assert len(rows) == 4
    for row in rows:
        trace = vf.Trace.model_validate(json.loads(row["trace_json"]))
        assert trace.stop_condition is vf.StopCondition.MAX_TURNS, trace.errors
        assert trace.errors == []
        # The program never quits by itself: without the replica's word it ran out the budget.
        assert not [n for n in trace.notes if "agent budget" in n], trace.notes
        refused_to_end = trace.timing["agent"].end - trace.calls[-1].ended_at
        print(f"last answered call -> agent end: {refused_to_end:.2f}s")
