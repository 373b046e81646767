"""The training batch builder (:mod:`vfray.train`) against hand-built traces: each sample's
tokens are exactly what the endpoint saw and returned, loss masks cover only sampled tokens,
advantages and policy versions are carried, and samples that cannot be trained on (no
advantage, a re-tokenisation break, no token ids) are counted, not repaired."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import vfray as vf
from vfray.trace import Message, TaskRecord, Trace
from vfray.train import build_batch, iter_batches

SYSTEM = Message(role="system", content="be brief")
USER = Message(role="user", content="2+2?")


def _trace(key: str, advantage: float | None, turns: list[dict], *, version: int = 0) -> Trace:
    """One trace whose calls carry the given prompt ids, completion ids and logprobs."""
    trace = Trace(task=TaskRecord(key=key, hash="h", data={"prompt": "2+2?"}), run_id="r")
    history = [SYSTEM, USER]
    for i, turn in enumerate(turns):
        reply = Message(role="assistant", content=f"reply {i}")
        trace.record_call(
            list(history),
            reply,
            prompt_token_ids=turn["prompt"],
            completion_token_ids=turn["completion"],
            completion_logprobs=turn.get("logprobs", [-0.5] * len(turn["completion"] or [])),
            policy_version=version + i,
            finish_reason=turn.get("finish", "stop"),
        )
        history += [reply, Message(role="user", content=f"next {i}")]
    trace.advantage = advantage
    trace.rewards["r"] = vf.trace.RewardRecord(value=1.0)
    return trace


def _traces() -> list[Trace]:
    two_turns = _trace(
        "two-turns",
        0.5,
        [
            {"prompt": [1, 2, 3], "completion": [10, 11], "logprobs": [-0.1, -0.2]},
            # The second prompt extends the first exactly: [1,2,3,10,11] + inserted [4,5].
            {"prompt": [1, 2, 3, 10, 11, 4, 5], "completion": [12], "logprobs": [-0.3]},
        ],
        version=3,
    )
    single = _trace("single", -0.5, [{"prompt": [7, 8], "completion": [20, 21, 22]}], version=5)
    drift = _trace(
        "drift",
        0.25,
        [
            {"prompt": [1, 2], "completion": [30]},
            {"prompt": [1, 9, 30, 4], "completion": [31]},  # history re-tokenised: 2 -> 9
        ],
    )
    failed = _trace("failed", None, [{"prompt": [1], "completion": [40]}])  # no advantage
    no_ids = _trace("no-ids", 0.1, [{"prompt": None, "completion": None, "logprobs": None}])
    return [two_turns, single, drift, failed, no_ids]


def test_samples_flag_a_prefix_break_and_missing_ids() -> None:
    samples = vf.to_samples(_traces())
    assert samples.column("token_error").to_pylist() == [
        None,
        None,
        "prefix_break",
        None,
        "missing",
    ]
    assert samples.column("completion_token_ids").to_pylist()[2] is None  # never repaired


def test_every_array_of_a_batch_is_its_own_and_writable() -> None:
    # Per-sample int columns came straight from Arrow's read-only buffers (policy_version,
    # rollout_index): torch.from_numpy warned, and a trainer writing into that CPU tensor
    # would have written into Arrow's memory.
    for layout in ("padded", "packed"):
        batch = build_batch(vf.to_samples(_traces()), layout=layout)
        for name, value in vars(batch).items():
            if isinstance(value, np.ndarray):
                assert value.flags.writeable, (layout, name)


def test_padded_batch_is_exactly_what_the_endpoint_saw_and_returned() -> None:
    batch = build_batch(vf.to_samples(_traces()), pad_id=-1)
    assert batch.stats.samples == 5 and batch.stats.used == 2
    assert batch.stats.no_advantage == 1
    assert batch.stats.token_errors == {"prefix_break": 1, "missing": 1}
    # Row 0: the last call's prompt + its completion, token for token.
    assert batch.input_ids.tolist() == [
        [1, 2, 3, 10, 11, 4, 5, 12],
        [7, 8, 20, 21, 22, -1, -1, -1],
    ]
    assert batch.attention_mask.tolist() == [[1] * 8, [1] * 5 + [0] * 3]
    # Loss only on the tokens the model sampled: not the prompt, not the inserted [4, 5].
    assert batch.loss_mask.tolist() == [[0, 0, 0, 1, 1, 0, 0, 1], [0, 0, 1, 1, 1, 0, 0, 0]]
    np.testing.assert_allclose(
        batch.old_logprobs,
        [[0, 0, 0, -0.1, -0.2, 0, 0, -0.3], [0, 0, -0.5, -0.5, -0.5, 0, 0, 0]],
        rtol=1e-6,
    )
    assert batch.advantages.tolist() == [0.5, -0.5]
    assert batch.policy_version.tolist() == [3, 5]  # the oldest call's version
    assert batch.position_ids[1].tolist() == [0, 1, 2, 3, 4, 0, 0, 0]
    assert len(batch) == 2 and len(set(batch.trace_ids)) == 2
    np.testing.assert_allclose(
        batch.token_advantages()[0], [0, 0, 0, 0.5, 0.5, 0, 0, 0.5], rtol=1e-6
    )


def test_a_batch_carries_the_fields_trainers_name() -> None:
    group = [
        _trace("q", 1.0, [{"prompt": [1, 2], "completion": [5, 6]}]),
        # The first turn hit max_tokens, the last did not: the sample is still truncated.
        _trace(
            "q",
            -1.0,
            [
                {"prompt": [1, 2], "completion": [5], "finish": "length"},
                {"prompt": [1, 2, 5, 3], "completion": [7], "finish": "tool_calls"},
            ],
        ),
        _trace("q", 0.0, [{"prompt": [1, 2], "completion": [8, 9, 9], "finish": "length"}]),
    ]
    for i, trace in enumerate(group):
        trace.episode_id, trace.rollout_index = "ep-1", i
    other = _trace("r", 0.5, [{"prompt": [4], "completion": [5]}])
    other.episode_id = "ep-2"
    samples = vf.to_samples([*group, other])
    assert samples.column("finish_reason").to_pylist() == ["stop", "tool_calls", "length", "stop"]
    assert samples.column("truncated").to_pylist() == [False, True, True, False]
    batch = build_batch(samples)
    assert batch.group_ids.tolist() == batch.uid.tolist() == ["ep-1"] * 3 + ["ep-2"]
    assert batch.rollout_index.tolist() == [0, 1, 2, 0]
    assert batch.trace_ids.tolist() == [t.trace_id for t in [*group, other]]
    assert batch.finish_reasons.tolist() == ["stop", "tool_calls", "length", "stop"]
    assert batch.truncated.tolist() == [False, True, True, False]
    assert batch.response_mask is batch.loss_mask
    assert batch.old_logprobs is batch.inference_logprobs
    # Cut here at max_length: truncated too (its end is gone).
    cut = build_batch(samples, max_length=3)
    assert cut.truncated.tolist() == [True, True, True, False]
    assert cut.stats.truncated == 3


def test_packed_batch_holds_the_same_tokens_back_to_back() -> None:
    batch = build_batch(vf.to_samples(_traces()), layout="packed")
    assert batch.input_ids.tolist() == [[1, 2, 3, 10, 11, 4, 5, 12, 7, 8, 20, 21, 22]]
    assert batch.cu_seqlens.tolist() == [0, 8, 13]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4]]
    assert batch.loss_mask.tolist() == [[0, 0, 0, 1, 1, 0, 0, 1, 0, 0, 1, 1, 1]]
    assert batch.sample_index.tolist() == [[0] * 8 + [1] * 5]


def test_max_length_truncates_or_drops() -> None:
    samples = vf.to_samples(_traces())
    cut = build_batch(samples, max_length=4)
    assert cut.input_ids.tolist() == [[1, 2, 3, 10], [7, 8, 20, 21]]
    assert cut.loss_mask.tolist() == [[0, 0, 0, 1], [0, 0, 1, 1]]
    assert cut.stats.truncated == 2 and cut.stats.used == 2
    dropped = build_batch(samples, max_length=6, overflow="drop")
    assert dropped.input_ids.tolist() == [[7, 8, 20, 21, 22]]
    assert dropped.stats.too_long == 1 and dropped.stats.used == 1
    padded = build_batch(samples, pad_to_multiple=16)
    assert padded.input_ids.shape == (2, 16)
    for layout in ("padded", "packed"):  # every sample too long: an empty batch, not a crash
        none = build_batch(samples, max_length=2, overflow="drop", layout=layout)
        assert len(none) == 0 and none.stats.too_long == 2 and none.input_ids.size == 0


def test_iter_batches_slices_a_table() -> None:
    samples = vf.to_samples(_traces() * 3)
    batches = list(iter_batches(samples, 4))
    assert [b.stats.samples for b in batches] == [4, 4, 4, 3]
    assert sum(b.stats.used for b in batches) == 6
    shuffled = list(iter_batches(samples, 15, shuffle_seed=1))
    assert shuffled[0].stats.used == 6


def test_samples_that_never_asked_for_tokens_are_refused_in_one_line() -> None:
    # A farm.run without sampling.return_tokens: every call came back without token ids.
    untokenised = [
        _trace(f"k{i}", 0.5, [{"prompt": None, "completion": None, "logprobs": None}])
        for i in range(3)
    ]
    with pytest.raises(ValueError, match="none of the 3 samples has token ids"):
        next(iter_batches(vf.to_samples(untokenised), 2))
    # Some with tokens: batches as before, the missing ones counted.
    batches = list(iter_batches(vf.to_samples([*untokenised, *_traces()]), 100))
    assert batches[0].stats.token_errors == {"missing": 4, "prefix_break": 1}
    # All broken by re-tokenisation is not "never asked": counted, not refused.
    drift = _traces()[2]
    assert next(iter_batches(vf.to_samples([drift]), 1)).stats.token_errors == {"prefix_break": 1}


def test_a_mismatched_mask_is_refused() -> None:
    samples = vf.to_samples(_traces()[1:2])
    bad = samples.set_column(
        samples.schema.get_field_index("completion_mask"),
        "completion_mask",
        vf.to_samples(_traces()[:1]).column("completion_mask"),
    )
    with pytest.raises(ValueError, match="do not match"):
        build_batch(bad)


class QA(vf.TaskData):
    answer: str


class Sum(vf.Task[QA]):
    @vf.reward
    def correct(self, trace: Trace) -> bool:
        return (trace.last_reply or "").strip() == self.data.answer


def test_run_dataset_reads_a_real_run_folder_into_tensors(tmp_path: Path) -> None:
    # A run written by the scripted model with token ids: RunDataset's tensors hold, row for
    # row, the tokens each call was sent and returned, the loss on the sampled ones only.
    pytest.importorskip("torch")
    from vfray.traces.convert import table_to_traces
    from vfray.train.torch import RunDataset

    tasks = [
        Sum(QA(prompt=f"What is {i} + {i % 3}?", answer=str(i + i % 3)), key=f"s{i}")
        for i in range(6)
    ]
    with vf.Farm(
        "scripted:arithmetic?accuracy=0.5",
        harness="null",
        backend="local",
        output_dir=str(tmp_path),
        sampling={"return_tokens": True},
        progress=False,
    ) as farm:
        farm.set_policy_version(2)
        result = farm.run(tasks, rollouts_per_task=4)
    calls = {t.trace_id: t.calls[-1] for t in table_to_traces(result.final_traces)}
    advantages = dict(
        zip(
            result.final_traces.column("trace_id").to_pylist(),
            result.final_traces.column("advantage").to_pylist(),
            strict=True,
        )
    )
    assert len(calls) == 24 and all(a is not None for a in advantages.values())

    batches = list(RunDataset(result.run_dir, 10, pad_id=-1))
    assert [len(b["trace_ids"]) for b in batches] == [10, 10, 4]
    seen = []
    for b in batches:
        ids, attention, loss = b["input_ids"], b["attention_mask"], b["loss_mask"]
        rows, width = ids.shape
        assert attention.shape == loss.shape == b["old_logprobs"].shape == (rows, width)
        assert b["advantages"].shape == b["policy_version"].shape == b["lengths"].shape == (rows,)
        assert width == int(b["lengths"].max())
        assert (attention.sum(1) == b["lengths"]).all()
        assert ((loss == 1) <= (attention == 1)).all()  # no loss on padding
        assert (b["old_logprobs"][loss == 0] == 0).all()
        assert (ids[attention == 0] == -1).all()
        assert (b["policy_version"] == 2).all()
        for row, trace_id in enumerate(b["trace_ids"]):
            call = calls[trace_id]
            prompt, completion = call.prompt_token_ids, call.completion_token_ids
            assert prompt and completion and call.completion_logprobs
            n = len(prompt) + len(completion)
            assert ids[row, :n].tolist() == prompt + completion
            assert loss[row].tolist() == [0] * len(prompt) + [1] * len(completion) + [0] * (
                width - n
            )
            np.testing.assert_allclose(
                b["old_logprobs"][row, len(prompt) : n].numpy(), call.completion_logprobs
            )
            assert float(b["advantages"][row]) == pytest.approx(advantages[trace_id])
            seen.append(trace_id)
    assert sorted(seen) == sorted(calls)
    # Packed and shuffled: the same samples, one row back to back.
    packed = list(RunDataset(result.run_dir, 24, shuffle_seed=0, layout="packed"))
    (one,) = packed
    assert one["input_ids"].shape == (1, int(one["lengths"].sum()))
    assert one["cu_seqlens"].tolist()[-1] == one["input_ids"].shape[1]
    assert sorted(one["trace_ids"]) == sorted(calls)
