"""vfray.train's batching around ``build_batch``: a live stream of scored groups cut into
batches of whole groups (a last smaller one, none of only unusable groups), a samples table
sliced and shuffled reproducibly, batch statistics added up, and a batch as torch tensors that
share the numpy arrays' memory. tests/test_train_batches.py checks the token layouts."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator

import numpy as np
import pyarrow as pa
import pytest

from vfray.episode import Episode
from vfray.run.outcomes import EpisodeGroup
from vfray.trace import Message, RewardRecord, TaskRecord, Trace
from vfray.traces.samples import to_samples
from vfray.train import iter_batches
from vfray.train.batch import BatchStats, build_batch
from vfray.train.loader import group_samples, stream_batches


def _trace(key: str, index: int, advantage: float | None, tokens: int = 2) -> Trace:
    task = TaskRecord(key=key, hash="h", data={"prompt": "q"})
    trace = Trace(task=task, run_id="r", episode_id=f"ep-{key}", rollout_index=index)
    trace.record_call(
        [Message(role="user", content="q")],
        Message(role="assistant", content=f"a{index}"),
        prompt_token_ids=[1, 2, 3],
        completion_token_ids=list(range(10, 10 + tokens)),
        completion_logprobs=[-0.5] * tokens,
    )
    trace.advantage = advantage
    trace.rewards["r"] = RewardRecord(value=1.0 if advantage and advantage > 0 else 0.0)
    return trace


def _group(key: str, advantages: list[float | None]) -> EpisodeGroup:
    traces = [_trace(key, i, a) for i, a in enumerate(advantages)]
    return EpisodeGroup(Episode(task=traces[0].task, traces=traces))


async def _stream(*groups: EpisodeGroup) -> AsyncIterator[EpisodeGroup]:
    for group in groups:
        await asyncio.sleep(0)
        yield group


def _collect(*groups: EpisodeGroup, batch_size: int, **build: object) -> list[list[str]]:
    async def run() -> list[list[str]]:
        return [
            [key.split(":")[0] for key in _keys(batch.trace_ids, groups)]
            async for batch in stream_batches(_stream(*groups), batch_size, **build)
        ]

    return asyncio.run(run())


def _keys(trace_ids: list[str], groups: tuple[EpisodeGroup, ...]) -> list[str]:
    owner = {t.trace_id: f"{t.task.key}:{t.rollout_index}" for g in groups for t in g.traces}
    return [owner[i] for i in trace_ids]


def test_a_stream_is_cut_into_batches_of_whole_groups() -> None:
    a, b, c = (_group(k, [0.5, -0.5]) for k in "abc")
    # Two usable samples per group: a batch closes once it holds at least three.
    assert _collect(a, b, c, batch_size=3) == [["a", "a", "b", "b"], ["c", "c"]]
    assert _collect(a, b, c, batch_size=2) == [["a", "a"], ["b", "b"], ["c", "c"]]
    assert _collect(a, b, c, batch_size=100) == [["a", "a", "b", "b", "c", "c"]]


def test_groups_without_a_policy_signal_do_not_fill_a_batch() -> None:
    failed = _group("x", [None, None])  # fewer than 2 counted rollouts: no advantages
    half = _group("y", [0.5, None])
    ok = _group("z", [0.5, -0.5])
    # The unusable group travels with the next usable ones; its rows are left out of the batch.
    assert _collect(failed, half, ok, batch_size=3) == [["y", "z", "z"]]
    assert _collect(failed, batch_size=1) == []  # nothing usable: no batch at all
    assert _collect(batch_size=1) == []


def test_build_options_reach_every_batch() -> None:
    async def run() -> list[tuple[str, tuple[int, ...]]]:
        groups = _stream(_group("a", [0.5, -0.5]), _group("b", [0.5, -0.5]))
        return [
            (batch.layout, batch.input_ids.shape)
            async for batch in stream_batches(groups, 2, layout="packed")
        ]

    assert asyncio.run(run()) == [("packed", (1, 10)), ("packed", (1, 10))]


def test_a_groups_samples_are_its_traces_branches() -> None:
    group = _group("a", [0.5, -0.5, None])
    samples = group_samples(group)
    assert samples.num_rows == 3
    assert samples.column("advantage").to_pylist() == [0.5, -0.5, None]
    assert samples.equals(to_samples(group.traces))


def _samples(n: int) -> pa.Table:
    traces = [_trace(f"t{i}", 0, 0.5 if i % 2 else -0.5) for i in range(n)]
    return to_samples(traces)


def test_batches_of_a_table_are_reproducibly_shuffled_and_cover_every_row() -> None:
    samples = _samples(7)
    ids = samples.column("trace_id").to_pylist()
    plain = [list(b.trace_ids) for b in iter_batches(samples, 3)]
    assert [len(b) for b in plain] == [3, 3, 1] and list(itertools.chain(*plain)) == ids
    shuffled = [list(b.trace_ids) for b in iter_batches(samples, 3, shuffle_seed=11)]
    again = [list(b.trace_ids) for b in iter_batches(samples, 3, shuffle_seed=11)]
    other = [list(b.trace_ids) for b in iter_batches(samples, 3, shuffle_seed=12)]
    assert shuffled == again and shuffled != plain and shuffled != other
    assert sorted(itertools.chain(*shuffled)) == sorted(ids)
    assert list(iter_batches(samples.slice(0, 0), 3)) == []


def test_batch_statistics_add_up_across_batches() -> None:
    total = BatchStats()
    total.add(BatchStats(samples=3, used=2, no_advantage=1, token_errors={"missing": 1}))
    total.add(
        BatchStats(samples=4, used=1, token_errors={"missing": 2, "prefix_break": 1}, too_long=1)
    )
    total.add(BatchStats(samples=1, no_logprobs=1, truncated=0))
    assert total == BatchStats(
        samples=8,
        used=3,
        no_advantage=1,
        token_errors={"missing": 3, "prefix_break": 1},
        no_logprobs=1,
        too_long=1,
    )


def test_a_batch_as_tensors_shares_its_arrays() -> None:
    torch = pytest.importorskip("torch")
    from vfray.train.torch import ALIASES, TENSORS, to_tensors

    batch = build_batch(_samples(3), max_length=4)
    tensors = to_tensors(batch)
    assert set(tensors) == {
        *TENSORS,
        *ALIASES,
        "stats",
        "layout",
        "trace_ids",
        "group_ids",
        "finish_reasons",
    }
    assert tensors["old_logprobs"] is tensors["inference_logprobs"]
    assert tensors["response_mask"] is tensors["loss_mask"]
    assert tensors["truncated"].dtype == torch.bool and bool(tensors["truncated"].all())
    assert tensors["input_ids"].dtype == torch.int64
    assert tensors["advantages"].dtype == torch.float32
    assert tuple(tensors["input_ids"].shape) == batch.input_ids.shape == (3, 4)
    assert tensors["stats"].truncated == 3
    assert list(tensors["trace_ids"]) == list(batch.trace_ids)
    batch.input_ids[0, 0] = 99  # no copy on the CPU
    assert int(tensors["input_ids"][0, 0]) == 99
    assert np.array_equal(tensors["loss_mask"].numpy(), batch.loss_mask)
