"""The pool harness: one warm worker process runs many rollouts' chat loops, each rollout's
commands in its own bwrap box, its calls under its own secret onto its own trace. Real parts
throughout: the worker is a real process, the boxes real bwrap boxes (and docker containers), the
model the scripted ``agent`` model behind the real interception; a farm on a real local Ray.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

import vfray as vf
from vfray.harnesses import make_harness
from vfray.harnesses.pool import PoolConfig, PoolHarness
from vfray.runtimes.base import Runtime

pytestmark = pytest.mark.bwrap


class WriteOwn(vf.Task[vf.TaskData]):
    """Each task writes its own line to the same file name: a command run in another
    rollout's box would leave a box with the wrong line (or none)."""

    def __init__(self, index: int, *, stop_at_once: bool = False) -> None:
        self.line = f"hello {index}"
        super().__init__(
            vf.TaskData(prompt=f'Write "{self.line}" to out.txt, then check it.', workdir="/box"),
            key=f"own-{index}",
        )
        self.stop_at_once = stop_at_once

    @vf.stop
    def stopped(self, trace: vf.Trace) -> bool:
        return self.stop_at_once and len(trace.calls) >= 1

    @vf.reward
    async def wrote_it(self, runtime: Runtime) -> bool:
        return (await runtime.read("out.txt")) == f"{self.line}\n".encode()


def _env(**options: object) -> vf.LocalEnvironment:
    return vf.LocalEnvironment(
        "scripted:agent", harness="pool", runtime="bwrap", harness_options=options
    )


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_pool_config_is_typed() -> None:
    harness = make_harness("pool", {"idle_seconds": 0, "pooled": False})
    assert isinstance(harness, PoolHarness) and isinstance(harness.config, PoolConfig)
    with pytest.raises(vf.ConfigError, match="pool"):
        make_harness("pool", {"max_steps": 0})


async def test_one_worker_serves_isolated_rollouts_and_a_stopped_one_ends_alone() -> None:
    """Five rollouts at once on one worker process: four score in their own boxes with their
    own three calls; the fifth is stopped by its task after one call and ends alone, by its
    stop; the worker ends once idle."""
    env = _env(idle_seconds=0.2)
    harness = env.harness
    assert isinstance(harness, PoolHarness)
    tasks = [WriteOwn(i) for i in range(4)] + [WriteOwn(4, stop_at_once=True)]
    async with env:
        traces = await asyncio.gather(*(env.rollout(t) for t in tasks))
        pid = harness.worker_pid
        assert pid is not None and _running(pid)
        assert harness.workers_started == 1  # one process served every rollout
        for task, trace in zip(tasks[:4], traces[:4], strict=True):
            assert trace.errors == [] and trace.reward == 1.0, (trace.errors, trace.notes)
            assert trace.stop_condition is vf.StopCondition.COMPLETED
            assert len(trace.calls) == 3
            # The trace holds this rollout's conversation only (its own secret).
            assert all(task.line in m.text for m in trace.messages if m.role == "user")
        stopped = traces[4]
        assert stopped.stop_condition is vf.StopCondition.STOP_HOOK, stopped.stop_condition
        assert stopped.errors == [] and len(stopped.calls) == 1
        # Later rollouts reuse the same warm process.
        again = await env.rollout(WriteOwn(5))
        assert again.reward == 1.0 and harness.workers_started == 1
        for _ in range(100):  # the idle worker is torn down (0.2 s after its last rollout)
            if not _running(pid):
                break
            await asyncio.sleep(0.05)
        assert not _running(pid)
        assert harness.worker_pid is None


async def test_a_dead_worker_fails_its_rollouts_and_the_next_one_starts_anew() -> None:
    env = _env(idle_seconds=5)
    harness = env.harness
    assert isinstance(harness, PoolHarness)
    async with env:
        first = await env.rollout(WriteOwn(0))
        assert first.reward == 1.0
        pid = harness.worker_pid
        assert pid is not None
        # A command that never ends keeps the rollout in flight while the worker is killed.
        task = WriteOwn(1)
        task.data = task.data.model_copy(update={"prompt": "run: sleep 60"})
        flight = asyncio.ensure_future(env.rollout(task))
        for _ in range(200):
            if len(harness._worker.jobs if harness._worker else []) == 1:
                break
            await asyncio.sleep(0.05)
        os.kill(pid, 9)
        killed = await flight
        # The agent phase's error is the worker's end (scoring then finds no out.txt).
        assert killed.errors[0].type == "HarnessError", killed.errors
        assert killed.errors[0].phase == "agent"
        assert "worker process ended (exit code -9)" in killed.errors[0].message
        after = await env.rollout(WriteOwn(2))
        assert after.reward == 1.0 and harness.workers_started == 2
        assert harness.worker_pid not in (None, pid)


@pytest.mark.docker
async def test_one_worker_serves_rollouts_in_docker_boxes(docker_url: str) -> None:
    """The commands go to each rollout's own container; the worker stays on the node."""
    from docker_engine import runtime_options

    env = vf.LocalEnvironment(
        "scripted:agent",
        harness="pool",
        runtime="docker",
        runtime_options=runtime_options(docker_url),
        # Each rollout starts its own container first: on a loaded machine one rollout can end
        # more than a fraction of a second before another's container is up, so a short idle
        # time would retire the worker between them (seen in CI: 2 workers).
        harness_options={"idle_seconds": 5},
    )
    harness = env.harness
    assert isinstance(harness, PoolHarness)
    async with env:
        traces = await asyncio.gather(*(env.rollout(WriteOwn(i)) for i in range(3)))
    assert harness.workers_started == 1
    for trace in traces:
        assert trace.errors == [] and trace.reward == 1.0, (trace.errors, trace.notes)
        assert len(trace.calls) == 3


class OwnLines(vf.Taskset[WriteOwn]):
    def load(self) -> list[WriteOwn]:
        return [WriteOwn(i) for i in range(4)]


def test_the_pool_runs_a_farm_on_ray(ray_local: None, tmp_path: Path) -> None:
    """On Ray the harness, and so its worker, lives in the SandboxHost actor that runs the
    rollouts."""
    with vf.Farm(
        "scripted:agent",
        harness="pool",
        runtime="bwrap",
        output_dir=str(tmp_path),
        progress=False,
        hosts=1,
    ) as farm:
        result = farm.run(OwnLines(), rollouts_per_task=1)
    summary = result.summary()
    assert summary["rollouts"] == 4 and summary["reward_mean"] == 1.0, summary
