"""The farm when its parts fail: a taskset that raises mid-run, scoring hooks that never return,
a model endpoint that goes away for a few seconds. Every finished rollout must be written and
the run must end (with one typed error where the run itself cannot go on). Both backends."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import vfray as vf
from vfray.farm import Farm
from vfray.tasksets.arithmetic import ArithmeticTask, ArithmeticTaskset


@pytest.fixture(params=["ray", "local"])
def backend(request: pytest.FixtureRequest) -> str:
    """Both backends; only the Ray one starts (or reuses) the local Ray."""
    if request.param == "ray":
        request.getfixturevalue("ray_local")
    return str(request.param)


def farm(tmp_path: Path, **kw: Any) -> Farm:
    options: dict[str, Any] = {
        "model": "scripted:arithmetic",
        "harness": "null",
        "runtime": "subprocess",
        "output_dir": str(tmp_path),
        "progress": False,
        "max_concurrent": 32,
    }
    options.update(kw)
    return Farm(**options)


# -- a taskset that fails mid-iteration ------------------------------------------------------


class DiesMidway(vf.Taskset[ArithmeticTask]):
    """Five tasks, then the source fails (a dataset shard that went away)."""

    def load(self) -> Iterator[ArithmeticTask]:
        yield from ArithmeticTaskset(num_tasks=5).load()
        raise RuntimeError("the dataset shard went away")


def test_taskset_failing_mid_run_keeps_every_started_rollout(tmp_path: Path, backend: str) -> None:
    run_dirs: list[Path] = []
    with (
        farm(tmp_path, model="scripted:arithmetic?latency=0.5", backend=backend) as f,
        pytest.raises(vf.TasksetError, match="dataset shard went away") as caught,
    ):
        f.run(DiesMidway(), rollouts_per_task=2, on_run_dir=run_dirs.append)
    assert "RuntimeError" in str(caught.value)
    result = vf.RunResult(run_dirs[0])
    assert result.traces.num_rows == 10  # the 5 started tasks' rollouts all finished
    assert result.episodes.num_rows == 5
    assert all(result.traces.column("ok").to_pylist())


# -- scoring hooks that never return ---------------------------------------------------------


class HangingGroup(vf.Task[vf.TaskData]):
    @vf.reward
    def fine(self) -> float:
        return 1.0

    @vf.group_reward
    def stuck(self, traces: list[vf.Trace]) -> list[float]:
        time.sleep(3600)  # a judge call without a timeout
        return [1.0] * len(traces)

    @vf.group_reward
    async def stuck_async(self, traces: list[vf.Trace]) -> list[float]:
        await asyncio.sleep(3600)
        return [1.0] * len(traces)


@pytest.mark.timeout(240)
def test_hanging_group_reward_times_out_and_the_rows_are_written(
    tmp_path: Path, backend: str
) -> None:
    config = vf.EvalConfig()
    config.env.timeouts = config.env.timeouts.model_copy(update={"scoring": 2.0})
    tasks = [HangingGroup(vf.TaskData(prompt=f"task {i}")) for i in range(2)]
    with farm(tmp_path, config=config, model="scripted:echo", backend=backend) as f:
        result = f.run(tasks, rollouts_per_task=2)
    rows = result.traces.to_pylist()
    assert len(rows) == 4 and result.episodes.num_rows == 2
    for row in rows:
        trace = vf.Trace.model_validate_json(row["trace_json"])
        assert trace.rewards["fine"].value == 1.0
        for key in ("stuck", "stuck_async"):
            assert trace.rewards[key].value is None
            assert "PhaseTimeoutError" in (trace.rewards[key].error or ""), trace.rewards[key]
        assert row["ok"]  # the rollout itself was fine; only its group reward is missing


BLOCKING_TASKSET = """
import time
import vfray as vf


class Judged(vf.Task[vf.TaskData]):
    @vf.reward
    def judged(self) -> float:
        if self.data.prompt.startswith("block"):
            time.sleep(3600)  # a sync judge that never answers
        return 1.0


class Mixed(vf.Taskset[Judged]):
    def load(self):
        blocked = [Judged(vf.TaskData(prompt=f"block {i}")) for i in range(8)]
        return blocked + [Judged(vf.TaskData(prompt=f"fine {i}")) for i in range(4)]
"""


def test_blocking_sync_reward_neither_starves_other_rollouts_nor_keeps_the_process(
    tmp_path: Path,
) -> None:
    """Eight rewards that block forever (more than the loop's default pool has threads): the
    other rollouts finish, the blocked ones record a scoring timeout, and the process exits."""
    source = tmp_path / "judged.py"
    source.write_text(BLOCKING_TASKSET)
    out = tmp_path / "out"
    code = (
        "import sys\n"
        "from vfray.cli.main import main\n"
        f"sys.exit(main(['eval', {str(source) + ':Mixed'!r}, '--harness', 'null',"
        " '-m', 'scripted:echo', '--backend', 'local', '--no-progress',"
        " '--env.timeouts.scoring', '2', '--env.timeouts.setup', '60',"
        f" '--env.timeouts.teardown', '60', '-o', {str(out)!r}]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    (run_dir,) = out.glob("*/*")
    rows = vf.RunResult(run_dir).traces.to_pylist()
    assert len(rows) == 12
    for row in rows:
        judged = {pair["key"]: pair for pair in row["rewards"]}["judged"]
        if "block " in row["task"]:
            assert row["error_type"] == "PhaseTimeoutError", row["error_message"]
            assert judged["value"] is None
        else:
            assert row["ok"], row["error_message"]
            assert judged["value"] == 1.0


# -- a model endpoint outage -----------------------------------------------------------------


@pytest.mark.timeout(300)
def test_model_outage_mid_run_fails_no_rollout_for_good(tmp_path: Path, backend: str) -> None:
    """The model server goes away for 8 s mid-run (connections refused), then comes back on
    the same port: rollouts hit by it are retried after a backoff, new ones wait, and every
    rollout ends correct."""
    from vfray.endpoints.retry import RetryPolicy
    from vfray.endpoints.serving import serve_in_thread
    from vfray.testing import ScriptedModel

    model = ScriptedModel("arithmetic", latency=0.3)
    config = vf.EvalConfig()
    config.retry = RetryPolicy(backoff=0.5, max_backoff=4.0, provider_retries=8, circuit_failures=3)
    first = serve_in_thread(model)
    url = first.__enter__()
    port = int(url.rsplit(":", 1)[1])
    f = farm(
        tmp_path, config=config, model="scripted", base_url=url + "/v1", max_concurrent=8,
        backend=backend,
    )  # fmt: skip

    async def outage() -> Any:
        run = asyncio.ensure_future(
            f.run_async(ArithmeticTaskset(num_tasks=20), rollouts_per_task=2)
        )
        while model.calls < 6:
            await asyncio.sleep(0.05)
        await asyncio.to_thread(first.__exit__, None, None, None)
        await asyncio.sleep(8.0)
        second = serve_in_thread(model, port=port)
        await asyncio.to_thread(second.__enter__)
        try:
            return await run
        finally:
            await asyncio.to_thread(second.__exit__, None, None, None)

    with f:
        if backend == "ray":
            f._start()
        result = asyncio.run(outage())
    rows = result.traces.to_pylist()
    hit = [r for r in rows if r["error_type"] == "ProviderError"]
    assert hit, "the outage should have failed some attempts"
    final = result.final_traces
    assert final.num_rows == 40
    assert all(final.column("ok").to_pylist()), [
        r["error_message"] for r in final.to_pylist() if not r["ok"]
    ]
    rewards = final.column("rewards").to_pylist()
    assert [{p["key"]: p["value"] for p in r}["correct"] for r in rewards] == [1.0] * 40
