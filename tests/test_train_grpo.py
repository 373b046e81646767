"""The GRPO example (``examples/rl``): one update on a hand-built batch moves the policy the
way the advantages say (the sampled tokens of a positive-advantage sample become likelier, of a
negative one less likely: a sign error or lost advantages fail it), and a few steps end to end:
its own char-level policy served through an OpenAI-compatible endpoint, rollouts through
``Farm.stream`` on the local backend, batches from :class:`vfray.train.torch.StreamDataset`,
weight updates and policy versions. The reward curve is measured by the example
(docs/guides/training.md)."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from types import ModuleType

import pytest

import vfray as vf
from vfray.trace import Message, RewardRecord, TaskRecord, Trace
from vfray.train import build_batch

torch = pytest.importorskip("torch")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "rl"


def _example(name: str) -> ModuleType:
    sys.path.insert(0, str(EXAMPLE))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(EXAMPLE))


def test_one_update_follows_the_advantages() -> None:
    # Two samples of one prompt, their tokens and logprobs as the endpoint would record them
    # from this policy: "3" answered "4" (advantage +1) and "7" (advantage -1).
    grpo, policy_mod = _example("grpo"), _example("policy")
    from vfray.train.torch import to_tensors

    torch.manual_seed(0)
    policy = policy_mod.CharPolicy()
    prompt = policy_mod.render([{"role": "user", "content": "3"}])
    replies = {"good": ([*policy_mod.encode("4"), policy_mod.EOS], 1.0)}
    replies["bad"] = ([*policy_mod.encode("7"), policy_mod.EOS], -1.0)

    def sequence_logprob(completion: list[int]) -> float:
        with torch.no_grad():
            lp = policy.token_logprobs(torch.tensor([prompt + completion]))[0]
        return float(lp[len(prompt) :].sum())

    traces = []
    for name, (completion, advantage) in replies.items():
        with torch.no_grad():
            lp = policy.token_logprobs(torch.tensor([prompt + completion]))[0]
        trace = Trace(task=TaskRecord(key="q", hash="h"), run_id="r", episode_id="e")
        trace.record_call(
            [Message(role="user", content="3")],
            Message(role="assistant", content=name),
            prompt_token_ids=prompt,
            completion_token_ids=completion,
            completion_logprobs=lp[len(prompt) :].tolist(),
        )
        trace.advantage = advantage
        trace.rewards["r"] = RewardRecord(value=max(advantage, 0.0))
        traces.append(trace)
    batch = to_tensors(build_batch(vf.to_samples(traces)))
    before = {name: sequence_logprob(c) for name, (c, _) in replies.items()}
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2)
    _loss, mismatch = grpo.update(policy, optimizer, batch, threading.Lock(), epochs=1, entropy=0.0)
    after = {name: sequence_logprob(c) for name, (c, _) in replies.items()}
    assert mismatch < 1e-5  # the batch's inference logprobs are this policy's
    assert after["good"] > before["good"] + 1e-3, (before, after)
    assert after["bad"] < before["bad"] - 1e-3, (before, after)


def test_a_few_grpo_steps_run_end_to_end(tmp_path: Path) -> None:
    grpo = _example("grpo")
    steps = 4
    history = grpo.train(
        steps=steps, groups_per_step=2, group_size=4, output_dir=str(tmp_path), log=False
    )
    assert len(history.rewards) == steps
    assert all(0.0 <= r <= 1.0 for r in history.rewards)
    # The trainer recomputed the sampled tokens' logprobs with the weights that sampled them.
    assert history.first_mismatch is not None and history.first_mismatch < 1e-4
    # Policy versions reach the batches: the first batch was sampled before any update, a
    # batch never carries a version set after it (version k is set after step k - 1), and the
    # versions the trainer set after its updates appear on later batches (the one-slot queues
    # keep a batch at most a step or two behind).
    versions = history.versions
    assert versions[0] == 0.0
    assert all(v <= step for step, v in enumerate(versions)), versions
    assert versions[-1] >= 1.0, versions
    assert history.samples >= steps * 8
    # The stream's thread is gone and the rows are in the run folder, tokens and all.
    assert not [t for t in threading.enumerate() if t.name == "vfray-stream"]
    (run_dir,) = [p.parent for p in tmp_path.glob("*/*/config.json")]
    samples = vf.to_samples(vf.RunResult(run_dir).final_traces)
    assert samples.num_rows >= steps * 8
    assert len(set(samples.column("policy_version").to_pylist())) >= 2  # stamped per call
    assert samples.column("token_error").null_count == samples.num_rows
    assert samples.column("completion_logprobs").null_count == 0


def test_the_grpo_notebook_is_committed_without_outputs() -> None:
    import nbformat

    book = nbformat.read(EXAMPLE.parents[1] / "notebooks" / "grpo.ipynb", as_version=4)
    code = [c for c in book.cells if c.cell_type == "code"]
    assert code and all(c.outputs == [] and c.execution_count is None for c in code)
    assert any("grpo.train(" in c.source for c in code)
