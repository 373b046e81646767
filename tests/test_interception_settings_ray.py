"""The interception's settings (``interception.*``) reach its app on Ray too: each SandboxHost's
own app (host mode) and the Serve pool's replicas (``farm.interception = "serve"``)."""

from __future__ import annotations

from pathlib import Path

import pytest

import vfray as vf
from vfray.traces import table_to_traces

CAP = 4096


class Prompts(vf.Taskset[vf.Task[vf.TaskData]]):
    def load(self) -> list[vf.Task[vf.TaskData]]:
        return [
            vf.Task(vf.TaskData(prompt="What is 2 + 3?"), key="small"),
            vf.Task(vf.TaskData(prompt="x" * (2 * CAP)), key="big"),
        ]


@pytest.mark.parametrize("mode", ["host", "serve"])
def test_the_body_cap_from_the_config_reaches_the_interception_on_ray(
    ray_local: None, tmp_path: Path, mode: str
) -> None:
    config = vf.EvalConfig()
    config.interception = config.interception.model_copy(update={"max_body_bytes": CAP})
    config.farm.interception = mode
    config.env.harness.options = {"retries": 1}
    with vf.Farm(
        config=config,
        model="scripted:arithmetic",
        harness="null",
        runtime="subprocess",
        output_dir=str(tmp_path),
        progress=False,
    ) as farm:
        result = farm.run(Prompts())
    traces = {t.task.key: t for t in table_to_traces(result.final_traces)}
    assert traces["small"].error() is None and traces["small"].last_reply == "5"
    refused = traces["big"].error()
    assert refused is not None and refused.type == "HarnessError", traces["big"].errors
    assert f"exceeds the {CAP}-byte limit" in refused.message
