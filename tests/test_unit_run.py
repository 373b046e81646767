"""vfray.run's pieces around the driver: the live progress line (rates, ETA, a resumed run's
baseline, an endpoint outage) printed on a terminal or as plain lines, and ``GroupStream``,
which hands scored groups over one slot and cancels its producer from any thread with the
producer's clean-up run before it says it is done."""

from __future__ import annotations

import asyncio
import io
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import pytest
from rich.console import Console

from vfray.episode import Episode
from vfray.run.outcomes import EpisodeGroup
from vfray.run.progress import Baseline, live_progress, render
from vfray.run.streams import GroupStream
from vfray.trace import RewardRecord, TaskRecord, Trace

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
