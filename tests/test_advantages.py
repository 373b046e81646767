"""Advantage estimators (:func:`vfray.episode.group_advantages`) against values worked out by
hand, the estimator chosen in the config reaching the traces of a real run, and DAPO's dynamic
sampling dropping groups whose rewards are all equal before they take room in a batch."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import vfray as vf
from vfray.episode import Episode, group_advantages
from vfray.run.outcomes import EpisodeGroup
from vfray.trace import Message, RewardRecord, TaskRecord, Trace
from vfray.train.loader import stream_batches, uniform_group

# rewards [2, 0, 1]: mean 1, deviations [1, -1, 0], sample std sqrt((1 + 1 + 0) / 2) = 1.
# rewards [1, 0, 0, 1]: mean 0.5, deviations ±0.5, sample std sqrt(4 * 0.25 / 3) = 1/sqrt(3).
HAND = {
    "mean": ([1.0, -1.0, 0.0], [0.5, -0.5, -0.5, 0.5]),
    "dr_grpo": ([1.0, -1.0, 0.0], [0.5, -0.5, -0.5, 0.5]),
    # (r - mean) / (std + 1e-6)
    "grpo": (
        [1 / (1 + 1e-6), -1 / (1 + 1e-6), 0.0],
        [s * 0.5 / (1 / math.sqrt(3) + 1e-6) for s in (1, -1, -1, 1)],
    ),
    # r_i - mean of the others: 2 - (0 + 1)/2 = 1.5, 0 - (2 + 1)/2 = -1.5, 1 - (2 + 0)/2 = 0;
    # 1 - (0 + 0 + 1)/3 = 2/3, 0 - (1 + 0 + 1)/3 = -2/3.
    "rloo": ([1.5, -1.5, 0.0], [2 / 3, -2 / 3, -2 / 3, 2 / 3]),
}


@pytest.mark.parametrize("estimator", sorted(HAND))
def test_each_estimator_matches_the_hand_computed_values(estimator: str) -> None:
    three, four = HAND[estimator]
    assert group_advantages([2.0, 0.0, 1.0], estimator) == pytest.approx(three, abs=1e-12)  # type: ignore[arg-type]
    assert group_advantages([1.0, 0.0, 0.0, 1.0], estimator) == pytest.approx(four, abs=1e-12)  # type: ignore[arg-type]
    # All equal: no signal, 0 everywhere (grpo does not divide by a zero std).
    assert group_advantages([1.0, 1.0, 1.0], estimator) == [0.0, 0.0, 0.0]  # type: ignore[arg-type]


def test_bad_groups_and_names_are_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match="at least 2 rewards"):
        group_advantages([1.0])
    with pytest.raises(ValueError, match="unknown advantage estimator 'ppo'"):
        group_advantages([1.0, 0.0], "ppo")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="advantage"):
        vf.EvalConfig.model_validate({"env": {"advantage": "ppo"}})


def _trace(key: str, index: int, reward: float | None, error: Exception | None = None) -> Trace:
    task = TaskRecord(key=key, hash="h", data={"prompt": "q"})
    trace = Trace(task=task, run_id="r", episode_id=f"ep-{key}", rollout_index=index)
    trace.record_call(
        [Message(role="user", content="q")],
        Message(role="assistant", content=f"a{index}"),
        prompt_token_ids=[1, 2],
        completion_token_ids=[10 + index],
        completion_logprobs=[-0.5],
    )
    if reward is not None:
        trace.rewards["r"] = RewardRecord(value=reward)
    if error is not None:
        trace.add_error(error, "agent")
    return trace


def test_an_episode_applies_its_estimator_to_the_rollouts_that_count() -> None:
    from vfray.errors import ProviderError

    traces = [
        _trace("a", 0, 2.0),
        _trace("a", 1, 0.0),
        _trace("a", 2, 5.0, ProviderError("500")),  # infrastructure: out of the group
        _trace("a", 3, 1.0),
    ]
    for estimator, (three, _) in HAND.items():
        episode = Episode(task=traces[0].task, traces=traces, estimator=estimator)  # type: ignore[arg-type]
        advantages = episode.advantages
        assert advantages[2] is None
        assert [a for a in advantages if a is not None] == pytest.approx(three, abs=1e-12)


class QA(vf.TaskData):
    answer: str


class Sum(vf.Task[QA]):
    @vf.reward
    def correct(self, trace: Trace) -> bool:
        return (trace.last_reply or "").strip() == self.data.answer


def test_the_configured_estimator_reaches_a_runs_traces(tmp_path: Path) -> None:
    tasks = [Sum(QA(prompt=f"What is {i} + 1?", answer=str(i + 1)), key=f"s{i}") for i in range(6)]
    config = vf.EvalConfig.model_validate({"env": {"advantage": "rloo"}})
    with vf.Farm(
        "scripted:arithmetic?accuracy=0.5",
        config=config,
        harness="null",
        backend="local",
        output_dir=str(tmp_path),
        progress=False,
    ) as farm:
        result = farm.run(tasks, rollouts_per_task=4)
    table = result.final_traces
    groups: dict[str, list[tuple[float, float | None]]] = {}
    for key, reward, advantage in zip(
        table.column("task_key").to_pylist(),
        table.column("reward").to_pylist(),
        table.column("advantage").to_pylist(),
        strict=True,
    ):
        groups.setdefault(key, []).append((reward, advantage))
    assert len(groups) == 6
    for members in groups.values():
        rewards = [r for r, _ in members]
        expected = [r - (sum(rewards) - r) / (len(rewards) - 1) for r in rewards]  # leave-one-out
        assert [a for _, a in members] == pytest.approx(expected)
    assert any(len({r for r, _ in m}) > 1 for m in groups.values())  # not all trivially 0


def _group(key: str, rewards: list[float | None]) -> EpisodeGroup:
    traces = [_trace(key, i, r) for i, r in enumerate(rewards)]
    episode = Episode(task=traces[0].task, traces=traces)
    for trace, advantage in zip(traces, episode.advantages, strict=True):
        trace.advantage = advantage
    return EpisodeGroup(episode)


def test_dynamic_sampling_drops_groups_whose_rewards_are_all_equal() -> None:
    right, wrong = _group("right", [1.0, 1.0]), _group("wrong", [0.0, 0.0])
    mixed_a, mixed_b = _group("mixed-a", [1.0, 0.0]), _group("mixed-b", [0.0, 1.0])
    lonely = _group("lonely", [1.0, None])  # one counted rollout: untrainable, not "uniform"
    assert uniform_group(right) and uniform_group(wrong)
    assert not uniform_group(mixed_a) and not uniform_group(lonely)

    async def stream() -> AsyncIterator[EpisodeGroup]:
        for group in (right, mixed_a, wrong, lonely, mixed_b):
            await asyncio.sleep(0)
            yield group

    async def batches(dynamic: bool) -> list[tuple[list[str], int]]:
        owner = {
            t.trace_id: t.task.key
            for g in (right, wrong, mixed_a, mixed_b, lonely)
            for t in g.traces
        }
        return [
            ([owner[t] for t in b.trace_ids], b.stats.uniform_groups)
            async for b in stream_batches(stream(), 4, dynamic_sampling=dynamic)
        ]

    # Without: the all-right group fills half the first batch with advantages of 0.
    assert asyncio.run(batches(False)) == [
        (["right", "right", "mixed-a", "mixed-a"], 0),
        (
            ["wrong", "wrong", "mixed-b", "mixed-b"],
            0,
        ),
    ]
    # With: both uniform groups are dropped before they take room; the batch is all signal.
    assert asyncio.run(batches(True)) == [(["mixed-a", "mixed-a", "mixed-b", "mixed-b"], 2)]
