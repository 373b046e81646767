"""The Ray farm's SandboxHosts start while the built-in model actor does (the hosts find it by
name, a ``LateUrl``): a model actor slow to start still serves every rollout, and one that
cannot start ends Farm start with its own error, once, without a hang."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from actors import cluster
from vfray.farm import Farm
from vfray.tasksets.arithmetic import ArithmeticTaskset

pytestmark = pytest.mark.usefixtures("ray_local")

SLOW_START_S = 3.0


def farm(tmp_path: Path) -> Farm:
    return Farm(
        model="scripted:arithmetic",
        harness="null",
        runtime="subprocess",
        output_dir=str(tmp_path),
        progress=False,
        max_concurrent=8,
    )


def model_actor_from(init: Any) -> Any:
    """cluster.start_scripted_model with ``init`` run first in the actor's constructor. Made
    here, so Ray ships the class by value (the test module is not importable on workers)."""
    from actors.model_server import ScriptedModelServer

    class Model(ScriptedModelServer):
        def __init__(self, policy: str, options: dict[str, Any]) -> None:
            init()
            super().__init__(policy, options)

    def start(policy: str, options: dict[str, Any], name: str) -> Any:
        import ray

        return (
            ray.remote(Model)
            .options(
                name=name,
                num_cpus=0,
                max_concurrency=1000,
                scheduling_strategy=cluster.local_node_strategy(),
            )
            .remote(policy, options)
        )

    return start


def test_a_slow_model_actor_start_still_serves_every_rollout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def slow() -> None:
        time.sleep(SLOW_START_S)

    monkeypatch.setattr(cluster, "start_scripted_model", model_actor_from(slow))
    with farm(tmp_path) as f:
        result = f.run(ArithmeticTaskset(num_tasks=4), rollouts_per_task=2)
        traces = result.traces.to_pylist()
        assert len(traces) == 8
        assert all(row["ok"] for row in traces), [row["error"] for row in traces]
        # The hosts read the model's URL once it was up, and every rollout called it.
        assert all(row["num_calls"] >= 1 for row in traces)
        assert len(f.host_stats()) >= 1


def test_a_model_actor_that_cannot_start_fails_farm_start_with_its_own_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken() -> None:
        raise RuntimeError("the model weights are missing")

    monkeypatch.setattr(cluster, "start_scripted_model", model_actor_from(broken))
    started = time.monotonic()
    f = farm(tmp_path)
    try:
        with pytest.raises(Exception, match="the model weights are missing") as caught:
            f._start()
    finally:
        f.close()
    assert time.monotonic() - started < 120  # no hang waiting for hosts that cannot start
    message = str(caught.value)
    assert "built-in model" in message
    # One error: the model's, not a host's failure that came of it.
    assert "SandboxHost" not in message
