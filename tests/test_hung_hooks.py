"""Sync scoring and ``@stop`` hooks that never return: each is given up at its deadline with a
typed timeout, its thread stops counting against the hook pool, and every rollout whose hooks
return at once still comes out ok. A real run on the local backend with the scripted model."""

from __future__ import annotations

import json
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import vfray as vf
from vfray._hook_calls import HOOK_THREADS, DaemonPool, hook_pool
from vfray.config import EvalConfig
from vfray.tasksets.arithmetic import ArithmeticData, ArithmeticTask

RELEASE = threading.Event()
"""Set when the test ends, so the hung hooks' threads finish."""


class HangsInReward(ArithmeticTask):
    @vf.reward
    def stuck(self, trace: vf.Trace) -> float:
        RELEASE.wait(600)
        return 1.0


class HangsInStop(ArithmeticTask):
    @vf.stop
    def stuck(self, trace: vf.Trace) -> bool:
        RELEASE.wait(600)
        return False


def task(cls: type[ArithmeticTask], i: int) -> ArithmeticTask:
    data = ArithmeticData(prompt=f"What is {i} + 1?", a=i, b=1, answer=i + 1)
    return cls(data, key=f"{cls.__name__}-{i}")


def test_hung_sync_hooks_give_their_threads_up_and_the_quick_rollouts_are_ok(
    tmp_path: Path,
) -> None:
    # Enough hung hooks to hold every thread of a fixed pool (2 rollouts per task).
    hung_reward = [task(HangsInReward, i) for i in range(HOOK_THREADS // 4)]
    hung_stop = [task(HangsInStop, i) for i in range(HOOK_THREADS // 4)]
    quick = [task(ArithmeticTask, i) for i in range(HOOK_THREADS)]
    config = EvalConfig()
    config.env.timeouts = config.env.timeouts.model_copy(
        update={"scoring": 5.0, "stop": 2.0, "agent": 60.0}
    )
    try:
        with vf.Farm(
            "scripted:arithmetic",
            config=config,
            harness="null",
            runtime="subprocess",
            backend="local",
            max_concurrent=16,
            output_dir=str(tmp_path),
            progress=False,
        ) as farm:
            result = farm.run([*hung_reward, *hung_stop, *quick], rollouts_per_task=2)
        # Every hung hook was given up and none has returned: they would hold the whole pool.
        assert hook_pool().abandoned >= HOOK_THREADS
    finally:
        RELEASE.set()
    rows = result.final_traces.to_pylist()
    assert len(rows) == 2 * (len(hung_reward) + len(hung_stop) + len(quick))
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_kind.setdefault(row["task_key"].split("-")[0], []).append(row)
    quick_rows = by_kind["ArithmeticTask"]
    assert [r["error_message"] for r in quick_rows if not r["ok"]] == []
    assert len(quick_rows) == 2 * len(quick)
    for row in by_kind["HangsInReward"]:
        assert not row["ok"] and row["error_type"] == "PhaseTimeoutError", row["error_message"]
        assert row["error_phase"] == "scoring" and "stuck" in row["error_message"]
    for row in by_kind["HangsInStop"]:
        assert row["ok"], row["error_message"]
        notes = json.loads(row["trace_json"])["notes"]
        late = [n for n in notes if "stop hook 'stuck'" in n]
        assert len(late) == 1 and "PhaseTimeoutError" in late[0], notes


def test_an_abandoned_call_frees_its_place_in_the_pool() -> None:
    pool = DaemonPool(2, "test-pool")
    held = threading.Event()
    try:
        stuck = [pool.submit(lambda: held.wait(60)) for _ in range(2)]
        waiting: Future[int] = pool.submit(lambda: 7)  # queued behind the two stuck calls
        for future in stuck:
            pool.abandon(future)
        assert waiting.result(timeout=30) == 7  # a worker started in the stuck ones' place
        assert pool.submit(lambda: 8).result(timeout=30) == 8
        assert pool.abandoned == 2
        never: Future[int] = Future()
        pool.abandon(never)  # a call not started yet is dropped, not counted
        assert never.cancelled() and pool.abandoned == 2
    finally:
        held.set()
    for future in stuck:
        future.result(timeout=30)
    assert pool.abandoned == 0


RELEASE_STOP = threading.Event()


class CountsStops(ArithmeticTask):
    asked = 0

    @vf.stop
    def stuck(self, trace: vf.Trace) -> bool:
        CountsStops.asked += 1
        RELEASE_STOP.wait(600)
        return True


async def test_a_stop_hook_past_its_deadline_is_noted_once_and_not_asked_again() -> None:
    from vfray.scoring import check_stop

    task = CountsStops(ArithmeticData(prompt="What is 1 + 1?", a=1, b=1, answer=2))
    trace = vf.Trace(task=task.record(), rollout_index=0)
    try:
        for _ in range(3):  # three model calls of one rollout
            assert await check_stop(task, trace, timeout=0.5) is None
    finally:
        RELEASE_STOP.set()
    assert CountsStops.asked == 1
    assert len(trace.notes) == 1 and "PhaseTimeoutError" in trace.notes[0], trace.notes
