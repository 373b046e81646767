"""vfray.run's pieces around the driver: the live progress line (rates, ETA, a resumed run's
baseline, an endpoint outage) printed on a terminal or as plain lines, and ``GroupStream``,
which hands scored groups over one slot and cancels its producer from any thread with the
producer's clean-up run before it says it is done."""

from __future__ import annotations

import asyncio
import io
import json
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pytest
from rich.console import Console

from vfray.config import EvalConfig
from vfray.episode import Episode
from vfray.errors import ConfigError
from vfray.run.folders import run_folder, run_header
from vfray.run.outcomes import EpisodeGroup
from vfray.run.progress import Baseline, live_progress, render
from vfray.run.results import RunResult, final_rows, summarize
from vfray.run.streams import GroupStream
from vfray.trace import (
    ErrorInfo,
    Message,
    RewardRecord,
    StopCondition,
    TaskRecord,
    Trace,
    Usage,
)
from vfray.traces.io import traces_to_table

# --- progress -----------------------------------------------------------------------------------


@dataclass
class Counters:
    submitted: int = 0
    done: int = 0
    errored: int = 0
    retried: int = 0
    reward_sum: float = 0.0
    rewarded: int = 0
    running: int = 0

    @property
    def in_flight(self) -> int:
        return self.running


@pytest.mark.parametrize(
    ("counters", "total", "elapsed", "line"),
    [
        (
            Counters(),
            None,
            0.0,
            "rollouts 0  in flight 0  errored 0  retried 0  reward -  0.0/s",
        ),
        (
            Counters(done=10, running=4, errored=1, retried=2, reward_sum=7.5, rewarded=10),
            40,
            5.0,
            "rollouts 10/40  in flight 4  errored 1  retried 2  reward 0.750  2.0/s  ETA 15s",
        ),
        # Everything done: no time left, whatever the rate.
        (Counters(done=3, reward_sum=1, rewarded=3), 3, 1.0, "reward 0.333  3.0/s  ETA 0s"),
        # Nothing done yet: no rate, so no ETA.
        (Counters(running=8), 100, 2.0, "rollouts 0/100  in flight 8"),
    ],
)
def test_the_progress_line(
    counters: Counters, total: int | None, elapsed: float, line: str
) -> None:
    shown = render(counters, total, elapsed)
    assert line in shown
    if counters.done == 0:
        assert "ETA" not in shown


def test_a_resumed_run_counts_its_earlier_rollouts_in_totals_not_in_the_rate() -> None:
    def done(reward: float | None) -> Trace:
        trace = Trace(task=TaskRecord(key="k", hash="h"))
        if reward is not None:
            trace.rewards["r"] = RewardRecord(value=reward)
        return trace

    @dataclass
    class State:
        done: dict[int, Trace]

    baseline = Baseline.of(
        {"a": State({0: done(1.0), 1: done(0.0)}), "b": State({0: done(None)}), "c": State({})}
    )
    assert baseline == Baseline(done=3, reward_sum=1.0, rewarded=2)
    line = render(Counters(done=2, reward_sum=2.0, rewarded=2), 10, 2.0, baseline)
    # 5 of 10 done, reward (1 + 2) / 4, rate 2 in 2 s: 1/s, so 5 s to go.
    assert line.startswith("rollouts 5/10") and "reward 0.750  1.0/s  ETA 5s" in line


def test_an_endpoint_outage_is_on_the_line() -> None:
    counters = Counters()
    counters.endpoint_down_since = time.time() - 42  # type: ignore[attr-defined]
    assert render(counters, None, 1.0).endswith("endpoint down 42s")


async def test_off_a_terminal_plain_lines_are_printed_every_interval_and_at_the_end() -> None:
    out = io.StringIO()
    counters = Counters()
    console = Console(file=out, force_terminal=False, force_jupyter=False)
    async with live_progress(counters, 4, console=console, interval=0.05):
        for _ in range(4):
            await asyncio.sleep(0.06)
            counters.done += 1
    lines = out.getvalue().splitlines()
    assert len(lines) >= 2 and all(line.startswith("rollouts ") for line in lines)
    assert lines[-1].startswith("rollouts 4/4")  # the last line says how it ended


async def test_on_a_terminal_the_line_refreshes_in_place() -> None:
    out = io.StringIO()
    counters = Counters(done=1)
    console = Console(file=out, force_terminal=True, width=120)
    async with live_progress(counters, 2, console=console):
        await asyncio.sleep(0.3)
        counters.done = 2
    text = out.getvalue()
    assert "rollouts 2/2" in text and "\x1b[" in text  # redrawn with cursor controls


async def test_disabled_progress_prints_nothing() -> None:
    out = io.StringIO()
    async with live_progress(Counters(), 1, enabled=False, console=Console(file=out)):
        await asyncio.sleep(0)
    assert out.getvalue() == ""


# --- GroupStream --------------------------------------------------------------------------------


def _group(key: str) -> EpisodeGroup:
    return EpisodeGroup(Episode(task=TaskRecord(key=key, hash="h")))


Deliver = Callable[[EpisodeGroup], Awaitable[None]]


class Producer:
    """A run that delivers ``keys`` one by one, notes each delivery and its own clean-up."""

    def __init__(self, *keys: str, fail: Exception | None = None, hang: bool = False) -> None:
        self.keys = keys
        self.fail = fail
        self.hang = hang
        self.delivered: list[str] = []
        self.cleaned = threading.Event()

    async def __call__(self, deliver: Deliver) -> None:
        try:
            for key in self.keys:
                await deliver(_group(key))
                self.delivered.append(key)
            if self.fail is not None:
                raise self.fail
            if self.hang:
                await asyncio.sleep(3600)
        finally:
            await asyncio.sleep(0.01)  # tearing boxes down takes a moment
            self.cleaned.set()


async def test_groups_arrive_in_order_then_the_stream_ends() -> None:
    producer = Producer("a", "b", "c")
    stream = GroupStream(producer)
    assert not stream.running
    assert [g.episode.task.key async for g in stream] == ["a", "b", "c"]
    assert producer.cleaned.is_set() and not stream.running
    with pytest.raises(StopAsyncIteration):
        await stream.__anext__()


async def test_one_slot_holds_the_producer_back_until_the_consumer_reads() -> None:
    producer = Producer("a", "b", "c")
    stream = GroupStream(producer)
    first = await stream.__anext__()
    await asyncio.sleep(0.05)
    # "a" was taken, "b" waits in the slot, "c" cannot be put yet.
    assert first.episode.task.key == "a" and producer.delivered == ["a", "b"]
    assert stream.running
    await stream.aclose()


async def test_the_runs_error_comes_after_the_groups_it_delivered() -> None:
    stream = GroupStream(Producer("a", fail=RuntimeError("the farm broke")))
    assert (await stream.__anext__()).episode.task.key == "a"
    with pytest.raises(RuntimeError, match="the farm broke"):
        await stream.__anext__()


async def test_closing_cancels_the_run_and_waits_for_its_clean_up() -> None:
    producer = Producer("a", hang=True)
    async with GroupStream(producer) as stream:
        assert (await stream.__anext__()).episode.task.key == "a"
        assert stream.running
    assert producer.cleaned.is_set() and not stream.running
    with pytest.raises(StopAsyncIteration):
        await stream.__anext__()
    await stream.aclose()  # again: nothing left to do


async def test_a_stream_closed_before_it_started_never_runs() -> None:
    producer = Producer("a")
    stream = GroupStream(producer)
    await stream.aclose()
    with pytest.raises(StopAsyncIteration):
        await stream.__anext__()
    assert producer.delivered == [] and not producer.cleaned.is_set()
    called: list[bool] = []
    stream.cancel(lambda: called.append(True))  # nothing runs: on_done at once
    assert called == [True]


async def test_cancel_from_another_thread_reports_after_the_clean_up() -> None:
    producer = Producer("a", hang=True)
    stream = GroupStream(producer)
    await stream.__anext__()
    seen: list[bool] = []
    done = threading.Event()

    def on_done() -> None:
        seen.append(producer.cleaned.is_set())
        done.set()

    threading.Thread(target=stream.cancel, args=(on_done,)).start()
    while not done.is_set():
        await asyncio.sleep(0.01)
    assert seen == [True] and not stream.running


async def test_cancel_and_wait_blocks_a_thread_until_the_run_is_torn_down() -> None:
    producer = Producer("a", hang=True)
    stream = GroupStream(producer)
    await stream.__anext__()
    waiter = asyncio.get_running_loop().run_in_executor(None, stream.cancel_and_wait, 30.0)
    await waiter
    assert producer.cleaned.is_set()


async def test_cancel_on_the_streams_own_loop_does_not_wait() -> None:
    producer = Producer("a", hang=True)
    stream = GroupStream(producer)
    await stream.__anext__()
    called: list[bool] = []
    stream.cancel(lambda: called.append(producer.cleaned.is_set()))
    assert called == []  # not yet: the clean-up runs on this loop
    for _ in range(200):
        if called:
            break
        await asyncio.sleep(0.01)
    assert called == [True]


# --- results read back from the traces ----------------------------------------------------------


def _row(
    key: str,
    index: int,
    reward: float | None,
    *,
    attempt: int = 0,
    error: tuple[str, str] | None = None,
    seat: str | None = None,
    stop: StopCondition | None = StopCondition.COMPLETED,
) -> Trace:
    trace = Trace(
        task=TaskRecord(key=key, hash="h"),
        rollout_index=index,
        attempt=attempt,
        seat=seat,
        stop_condition=stop,
    )
    trace.record_call(
        [Message(role="user", content="q")],
        Message(role="assistant", content="a"),
        usage=Usage(input_tokens=10, output_tokens=2),
    )
    if reward is not None:
        trace.rewards["correct"] = RewardRecord(value=reward)
        trace.metrics["chars"] = None if reward == 0 else 5.0
    if error is not None:
        trace.errors = [ErrorInfo(type=error[0], message="m", phase=error[1])]
    return trace


def test_the_final_row_of_a_rollout_is_its_last_attempt() -> None:
    table = traces_to_table(
        [
            _row("a", 0, None, attempt=0, error=("SandboxError", "setup")),
            _row("a", 1, 1.0),
            _row("a", 0, 0.5, attempt=2),
            _row("a", 0, None, attempt=1, error=("ProviderError", "agent")),
        ]
    )
    final = final_rows(table)
    assert [
        (r["rollout_index"], r["attempt"])
        for r in final.select(["rollout_index", "attempt"]).to_pylist()
    ] == [(1, 0), (0, 2)]
    once = traces_to_table([_row("a", 0, 1.0), _row("b", 0, 0.0)])
    assert final_rows(once) is once  # one row per rollout: nothing to drop, no copy
    assert final_rows(once.slice(0, 0)).num_rows == 0


def test_a_games_last_attempt_keeps_a_row_per_seat() -> None:
    table = traces_to_table(
        [
            _row("g", 0, 0.0, attempt=0, seat="alice"),
            _row("g", 0, 1.0, attempt=0, seat="bob"),
            _row("g", 0, 1.0, attempt=1, seat="alice"),
            _row("g", 0, 0.0, attempt=1, seat="bob"),
        ]
    )
    final = final_rows(table)
    assert final.select(["seat", "attempt"]).to_pylist() == [
        {"seat": "alice", "attempt": 1},
        {"seat": "bob", "attempt": 1},
    ]
    assert summarize(table)["seats"] == {"alice": 1.0, "bob": 0.0}


def test_the_summary_counts_what_a_results_table_shows() -> None:
    table = traces_to_table(
        [
            _row("a", 0, 1.0),
            _row("a", 1, 0.0),
            _row("b", 0, 0.0, error=("SandboxError", "setup")),  # infra: not counted
            _row("b", 1, 1.0, error=("PhaseTimeoutError", "agent")),  # the policy's: counted
            _row("c", 0, None, error=("TaskError", "setup"), stop=None),
            _row("c", 0, 1.0, attempt=1, stop=StopCondition.MAX_TURNS),
        ]
    )
    summary = summarize(table)
    assert (summary["rollouts"], summary["attempts"], summary["ok"]) == (5, 6, 3)
    assert summary["reward_mean"] == pytest.approx(0.6)
    assert summary["reward_stderr"] == pytest.approx((0.3 / 5) ** 0.5)
    assert summary["reward_mean_counted"] == pytest.approx(0.75)  # 1, 0, 1, 1
    assert summary["errors"] == {"SandboxError": 1, "PhaseTimeoutError": 1}
    assert summary["stop_conditions"] == {"completed": 4, "max_turns": 1}
    assert (summary["input_tokens"], summary["output_tokens"]) == (50, 10)
    assert summary["rewards"] == {"correct": pytest.approx(0.6)}
    assert summary["metrics"] == {"chars": 5.0}  # unscored values left out of the mean
    assert "seats" not in summary and "groups_untrainable" not in summary


def test_an_empty_run_summarizes_to_zeros_and_nothing() -> None:
    summary = summarize(traces_to_table([]))
    assert (summary["rollouts"], summary["ok"], summary["reward_mean"]) == (0, 0, None)
    assert summary["rewards"] == {} and summary["errors"] == {} and summary["input_tokens"] == 0
    one = summarize(traces_to_table([_row("a", 0, 0.5)]))
    assert (one["reward_mean"], one["reward_stderr"]) == (0.5, None)  # no spread from one


def _episodes(*groups: tuple[int, list[float | None], float | None, float | None]) -> pa.Table:
    from vfray.traces.episodes import EPISODE_SCHEMA

    rows = [
        {
            "schema_version": 1,
            "episode_id": f"e{i}",
            "task_key": f"t{i}",
            "n": n,
            "rollout_indices": list(range(n)),
            "advantages": advantages,
            "pass_at_1": p1,
            "pass_at_n": pn,
        }
        for i, (n, advantages, p1, pn) in enumerate(groups)
    ]
    return pa.Table.from_pylist(rows, schema=EPISODE_SCHEMA)


def test_pass_at_k_and_untrainable_groups_come_from_the_episodes() -> None:
    traces = traces_to_table([_row("a", 0, 1.0)])
    summary = summarize(
        traces,
        _episodes(
            (4, [0.5, -0.5, 0.0, 0.0], 0.5, 1.0), (4, [None] * 4, 0.0, 0.0), (4, [], None, None)
        ),
    )
    assert summary["pass@1"] == 0.25 and summary["pass@4"] == 0.5
    assert summary["groups_untrainable"] == 2
    # Groups of one rollout are never compared: no untrainable count, no pass@n.
    single = summarize(traces, _episodes((1, [None], 1.0, 1.0), (1, [None], 0.0, 0.0)))
    assert single["pass@1"] == 0.5 and "pass@1" in single and "groups_untrainable" not in single
    assert not any(k.startswith("pass@") and k != "pass@1" for k in single)
    # Groups of different sizes: no single n for pass@n.
    mixed = summarize(traces, _episodes((2, [0.5, -0.5], 0.5, 1.0), (3, [0, 0, 0], 0.0, 0.0)))
    assert [k for k in mixed if k.startswith("pass@")] == ["pass@1"]


def test_a_run_result_is_its_folder(tmp_path: Path) -> None:
    result = RunResult(tmp_path)
    assert result == RunResult(str(tmp_path)) and len({result, RunResult(tmp_path)}) == 1
    assert result != tmp_path and repr(result) == f"RunResult({str(tmp_path)!r})"
    assert result.episodes.num_rows == 0  # no episodes folder yet


# --- run folders --------------------------------------------------------------------------------


def test_a_new_run_folder_is_named_by_taskset_model_and_harness(tmp_path: Path) -> None:
    config = EvalConfig(taskset="t", output_dir=str(tmp_path), model={"name": "org/Model v2"})
    run_dir, run_id = run_folder(config, "my tasks/v1", None)
    assert run_dir.parent == tmp_path / "my_tasks_v1--org_Model_v2--bash"
    assert run_dir.name == run_id and len(run_id.split("-")) == 3
    header = run_header(config, run_id, "my tasks/v1", 4)
    assert (header["run_id"], header["taskset"], header["rollouts_per_task"]) == (
        run_id,
        "my tasks/v1",
        4,
    )
    assert header["config"]["model"]["name"] == "org/Model v2"
    assert set(header["versions"]) == {"vfray", "ray", "python"}


def test_a_resumed_run_keeps_its_folder_and_id(tmp_path: Path) -> None:
    config = EvalConfig(taskset="t", output_dir=str(tmp_path))
    with pytest.raises(ConfigError, match=f"cannot resume {tmp_path}: it has no config.json"):
        run_folder(config, "t", tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"run_id": "run-42"}))
    assert run_folder(config, "t", str(tmp_path)) == (tmp_path, "run-42")
    (tmp_path / "config.json").write_text(json.dumps({}))
    assert run_folder(config, "t", tmp_path) == (tmp_path, tmp_path.name)
