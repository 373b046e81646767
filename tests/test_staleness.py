"""Bounded staleness: ``Farm.stream(max_staleness=k)`` drops, or runs again, a group whose calls
are more than k policy versions behind the trainer when it arrives (prime-rl's max_async_level)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import vfray as vf
from vfray.errors import ConfigError
from vfray.run.outcomes import EpisodeGroup
from vfray.run.staleness import MAX_RERUNS, Requeue, group_staleness
from vfray.trace import Message, Trace


class QA(vf.TaskData):
    answer: str


class SlowToScore(vf.Task[QA]):
    """Task "0" is scored at once; the others' calls are made as fast, but they are scored a
    second later, so they arrive after the trainer stepped on the first group."""

    @vf.reward
    async def correct(self, trace: Trace) -> float:
        if self.key != "0" and not any(c.policy_version for c in trace.calls):
            await asyncio.sleep(1.0)
        return 1.0


def tasks() -> list[SlowToScore]:
    return [
        SlowToScore(QA(prompt=f"What is {i} + 1?", answer=str(i + 1)), key=str(i)) for i in range(4)
    ]


def _group(versions: list[int | None]) -> EpisodeGroup:
    task = SlowToScore(QA(prompt="p", answer="a"), key="k")
    traces = []
    for version in versions:
        trace = Trace(task=task.record())
        reply = Message(role="assistant", content="a")
        trace.record_call(task.data.prompt_messages, reply, policy_version=version)
        traces.append(trace)
    return EpisodeGroup(vf.Episode(task=task.record(), traces=traces))


def test_a_group_is_as_old_as_its_oldest_call() -> None:
    assert group_staleness(_group([5, 3]), 7) == 4
    assert group_staleness(_group([5, None]), 7) == 7  # before any version: version 0
    assert group_staleness(_group([5, 3]), None) is None


def test_a_task_is_run_again_a_bounded_number_of_times() -> None:
    task = tasks()[1]
    source = Requeue([task])
    assert next(source) is task
    for _ in range(MAX_RERUNS):
        assert source.rerun("1") and source.queued
        assert next(source) is task
    assert not source.rerun("1")  # given up: dropped
    with pytest.raises(StopIteration):
        next(source)


async def _consume(farm: vf.Farm, on_stale: str) -> list[tuple[EpisodeGroup, int | None]]:
    """Trainer: step (version 0 -> 5) on the first group; record each group's age on arrival."""
    got = []
    async for group in farm.stream(
        tasks(), rollouts_per_task=2, max_staleness=1, on_stale=on_stale
    ):
        got.append((group, group_staleness(group, farm.policy_version)))
        if len(got) == 1:
            farm.set_policy_version(5)
    return got


@pytest.mark.parametrize("on_stale", ["drop", "rerun"])
def test_stale_groups_are_dropped_or_run_again(tmp_path: Path, on_stale: str) -> None:
    # Every call is made (and stamped with version 0) before the first answer comes back 2 s
    # later: with instant answers, under load, the first group could arrive (and the trainer
    # step) before the other groups had made theirs, and no group was stale.
    with vf.Farm(
        "scripted:arithmetic?latency=2",
        harness="null",
        backend="local",
        output_dir=str(tmp_path),
        progress=False,
    ) as farm:
        farm.set_policy_version(0)
        got = asyncio.run(_consume(farm, on_stale))
    keys = [group.episode.task.key for group, _ in got]
    assert keys[0] == "0"
    assert all(age is not None and age <= 1 for _, age in got)
    assert farm.stale_groups == 3
    if on_stale == "drop":
        assert keys == ["0"]
    else:
        assert sorted(keys) == ["0", "1", "2", "3"]
        for group, _ in got[1:]:
            assert {c.policy_version for t in group.traces for c in t.calls} == {5}


def test_bad_staleness_options_are_refused_in_one_line(tmp_path: Path) -> None:
    with vf.Farm(
        "scripted:arithmetic", harness="null", backend="local", output_dir=str(tmp_path)
    ) as farm:
        with pytest.raises(ConfigError, match="max_staleness must be >= 0"):
            farm.stream(tasks(), max_staleness=-1)
        with pytest.raises(ConfigError, match="on_stale must be one of drop, rerun"):
            farm.stream(tasks(), max_staleness=1, on_stale="wait")
