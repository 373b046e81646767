"""The training batch builder (:mod:`vfray.train`) against hand-built traces: each sample's
tokens are exactly what the endpoint saw and returned, loss masks cover only sampled tokens,
advantages and policy versions are carried, and samples that cannot be trained on (no
advantage, a re-tokenisation break, no token ids) are counted, not repaired."""

from __future__ import annotations

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


def test_iter_batches_slices_a_table() -> None:
    samples = vf.to_samples(_traces() * 3)
    batches = list(iter_batches(samples, 4))
    assert [b.stats.samples for b in batches] == [4, 4, 4, 3]
    assert sum(b.stats.used for b in batches) == 6
    shuffled = list(iter_batches(samples, 15, shuffle_seed=1))
    assert shuffled[0].stats.used == 6


def test_a_mismatched_mask_is_refused() -> None:
    samples = vf.to_samples(_traces()[1:2])
    bad = samples.set_column(
        samples.schema.get_field_index("completion_mask"),
        "completion_mask",
        vf.to_samples(_traces()[:1]).column("completion_mask"),
    )
    with pytest.raises(ValueError, match="do not match"):
        build_batch(bad)
