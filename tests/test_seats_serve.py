"""Seated tasks with ``farm.interception = "serve"`` on a real local Ray: the run's seats record
their turns through the node's interception replica (each turn's reply read from the session's
snapshot), a seat with its own model through an interception in its host."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_interception_pool import serve_farm
from vfray._plugins import load_object
from vfray.traces import read_traces

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SumDuels = load_object(f"{EXAMPLES}/sum_duel.py:SumDuels")
WRONG = "scripted:arithmetic?accuracy=0"

pytestmark = pytest.mark.usefixtures("ray_local")


def test_seated_tasks_run_with_the_serve_interception_pool(tmp_path: Path) -> None:
    from ray import serve

    with serve_farm(tmp_path, max_concurrent=4) as farm:
        result = farm.run(SumDuels(n=1, rounds=4, models={"bob": WRONG}), rollouts_per_task=2)
        handle = serve.get_deployment_handle("Interception", farm._pool.app_name)
        replica = handle.stats.remote().result(timeout_s=60)
    rows = read_traces(result.run_dir / "traces").to_pylist()
    assert all(row["ok"] for row in rows), [row["errors"] for row in rows]
    assert len(rows) == 4  # two games, two seats each, no attempt retried
    by_seat = {seat: [r for r in rows if r["seat"] == seat] for seat in ("alice", "bob")}
    # Alice (the run's model, through the replica) answered round 1 right; bob (his own model,
    # through his host's interception) got a question built on her reply, and erred.
    for row in by_seat["alice"]:
        assert row["model"] == "scripted:arithmetic" and row["num_calls"] == 1
        assert row["reward"] == 1.0
    for row in by_seat["bob"]:
        assert row["model"] == WRONG and row["num_calls"] == 1
        assert row["reward"] == 0.0
    assert result.summary()["seats"] == {"alice": 1.0, "bob": 0.0}
    assert replica["sessions"] == 0  # every seat's session with the replica was concluded
