"""Per-turn rewards: a task's ``@vf.reward`` hook gives each model call a reward of its own
(``trace.set_turn_reward``); it is carried on the trace, in the trace table's ``turn_rewards``
column, in the samples' ``completion_rewards`` (on each turn's last sampled token) and in the
batches' ``token_level_rewards`` (verl's name), padded and packed, through a real run folder."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import vfray as vf
from vfray.trace import Message, TaskRecord, Trace
from vfray.traces.convert import table_to_traces, traces_to_table
from vfray.train import build_batch, iter_batches, read_samples


def _two_turns() -> Trace:
    trace = Trace(task=TaskRecord(key="k", hash="h"), run_id="r", episode_id="e")
    history = [Message(role="user", content="go")]
    turns = [([1, 2, 3], [10, 11]), ([1, 2, 3, 10, 11, 4, 5], [12])]
    for i, (prompt, completion) in enumerate(turns):
        reply = Message(role="assistant", content=f"reply {i}")
        trace.record_call(
            list(history),
            reply,
            prompt_token_ids=prompt,
            completion_token_ids=completion,
            completion_logprobs=[-0.5] * len(completion),
            finish_reason="stop",
        )
        history += [reply, Message(role="user", content=f"next {i}")]
    trace.advantage = 1.0
    return trace


def test_turn_rewards_reach_the_samples_and_the_batch() -> None:
    trace = _two_turns()
    trace.set_turn_reward(0, 0.25)
    trace.set_turn_reward(trace.calls[1], -1)
    # The trace table carries them per call, and the lossless JSON keeps them.
    table = traces_to_table([trace])
    assert table.column("turn_rewards").to_pylist() == [[0.25, -1.0]]
    (back,) = table_to_traces(table)
    assert back.turn_rewards == {0: 0.25, 1: -1.0}
    # completion = [10, 11] + inserted [4, 5] + [12]: each turn's reward on its last token.
    (row,) = vf.to_samples(table).to_pylist()
    assert row["completion_rewards"] == [0.0, 0.25, 0.0, 0.0, -1.0]
    plain = _two_turns()
    batch = build_batch(vf.to_samples([trace, plain]), pad_id=-1)
    assert batch.token_level_rewards.shape == batch.input_ids.shape == (2, 8)
    assert batch.token_level_rewards.tolist() == [[0, 0, 0, 0, 0.25, 0, 0, -1.0], [0] * 8]
    # Rewards sit only on sampled tokens; packed holds the same values back to back.
    assert (batch.token_level_rewards[batch.loss_mask == 0] == 0).all()
    packed = build_batch(vf.to_samples([plain, trace]), layout="packed")
    assert packed.token_level_rewards[0].tolist() == [0] * 8 + [0, 0, 0, 0, 0.25, 0, 0, -1.0]
    # Truncation cuts the rewards with the tokens.
    cut = build_batch(vf.to_samples([trace]), max_length=6)
    assert cut.token_level_rewards.tolist() == [[0, 0, 0, 0, 0.25, 0]]
    try:  # the torch batches carry them too, where torch is installed (the train extra)
        from vfray.train.torch import to_tensors
    except ImportError:
        pass
    else:
        tensors = to_tensors(batch)
        assert tensors["token_level_rewards"].tolist() == batch.token_level_rewards.tolist()
    # A per-turn sample (a broken branch split by turn) carries its own turn's reward.
    broken = _two_turns()
    broken.calls[1] = broken.calls[1].model_copy(update={"prompt_token_ids": [1, 9, 10, 11]})
    broken.set_turn_reward(1, 2.0)
    rows = vf.to_samples([broken], on_prefix_break="per_turn").to_pylist()
    assert [r["completion_rewards"] for r in rows] == [None, [2.0]]


def test_bad_turn_rewards_are_refused_in_one_line() -> None:
    trace = _two_turns()
    with pytest.raises(ValueError, match="no model call 2"):
        trace.set_turn_reward(2, 1.0)
    with pytest.raises(ValueError, match="finite"):
        trace.set_turn_reward(0, float("nan"))
    with pytest.raises(TypeError, match="number"):
        trace.set_turn_reward(0, "1")  # type: ignore[arg-type]


class QA(vf.TaskData):
    answer: str


class Graded(vf.Task[QA]):
    @vf.reward
    def correct(self, trace: Trace) -> bool:
        # Every turn gets 0.5 for replying at all, apart from the outcome reward.
        for call in trace.calls:
            trace.set_turn_reward(call, 0.5)
        return (trace.last_reply or "").strip() == self.data.answer


def test_a_task_hook_gives_turn_rewards_through_a_run_folder(tmp_path: Path) -> None:
    tasks = [Graded(QA(prompt=f"What is {i} + 1?", answer=str(i + 1)), key=f"q{i}") for i in (1, 2)]
    with vf.Farm(
        "scripted:arithmetic",
        harness="null",
        backend="local",
        output_dir=str(tmp_path),
        sampling={"return_tokens": True},
        progress=False,
    ) as farm:
        result = farm.run(tasks, rollouts_per_task=2)
    assert result.final_traces.column("turn_rewards").to_pylist() == [[0.5]] * 4
    (batch,) = iter_batches(read_samples(result.run_dir), 8)
    assert batch.stats.used == 4
    # One turn each: its reward on the last sampled token, nowhere else.
    last = batch.lengths - 1
    assert batch.token_level_rewards[np.arange(4), last].tolist() == [0.5] * 4
    assert batch.token_level_rewards.sum() == pytest.approx(2.0)
    assert (batch.loss_mask[np.arange(4), last] == 1).all()
