"""TRL's ``GRPOTrainer`` with vfray as its ``rollout_func`` (:mod:`vfray.train.trl`), one real
training step on CPU: the example's tiny random-weight Llama (``examples/rl/trl_grpo.py``) is
served to the interception, ``Farm.stream`` runs the step's groups, and TRL trains on what came
back.

Checked: the tokens and logprobs TRL got are the served policy's (recomputed by the trainer's
model before the step, they match); the masks and vfray's advantages reach TRL's loss (after
the step, the advantage-weighted change of the samples' logprobs is positive: a lost, zeroed or
negated advantage fails it); bad prompts are refused in one line. Skipped without the ``train``
extra's ``trl``."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "rl"
GROUPS, GENERATIONS = 3, 4


def _example() -> Any:
    sys.path.insert(0, str(EXAMPLE))
    try:
        return __import__("trl_grpo")
    finally:
        sys.path.remove(str(EXAMPLE))


def _logprobs(model: Any, prompt: list[int], completion: list[int]) -> Any:
    """The model's logprob of each completion token after the prompt."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion)[:, None])[:, 0]


def test_one_trl_step_trains_on_vfray_rollouts(tmp_path: Path) -> None:
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from trl import GRPOTrainer

    from vfray.train.trl import ADVANTAGE, TRLRollouts, vfray_advantage

    ex = _example()
    torch.manual_seed(0)
    tokenizer = ex.build_tokenizer()
    model = ex.build_model(tokenizer)
    seen: list[dict[str, Any]] = []
    with (
        ex.serve_model(model, tokenizer) as url,
        ex.make_farm(url, GROUPS * GENERATIONS, str(tmp_path)) as farm,
    ):
        rollouts = TRLRollouts(farm, ex.tasks(GROUPS), num_generations=GENERATIONS)

        def rollout_func(prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
            out = rollouts(prompts, trainer)
            # Before the step: the weights that sampled these tokens.
            before = [
                _logprobs(model, p, c)
                for p, c in zip(out["prompt_ids"], out["completion_ids"], strict=True)
            ]
            seen.append({**out, "before": before, "keys": list(prompts)})
            return out

        trainer = GRPOTrainer(
            model=model,
            reward_funcs=[vfray_advantage],
            args=ex.grpo_config(str(tmp_path / "trl"), 1, GENERATIONS, GROUPS, reward_weights=None),
            train_dataset=rollouts.dataset(),
            processing_class=tokenizer,
            rollout_func=rollout_func,
        )
        trainer.train()

        with pytest.raises(ValueError, match="not a whole number of groups"):
            rollouts(["digits-0"] * (GENERATIONS - 1))
        with pytest.raises(ValueError, match="is not a task key"):
            rollouts(["nope"] * GENERATIONS)

    assert len(seen) == 1 and not rollouts.placeholders
    out = seen[0]
    assert len(out["prompt_ids"]) == GROUPS * GENERATIONS
    # Each group's rollouts are one vfray group, its prompt the endpoint's own rendering.
    assert len(rollouts.groups) == GROUPS
    for group in rollouts.groups:
        assert len(group.traces) == GENERATIONS
    for key, prompt_ids in zip(out["keys"], out["prompt_ids"], strict=True):
        messages = [{"role": "user", "content": rollouts.tasks[key].data.prompt}]
        assert prompt_ids == ex.encode_chat(tokenizer, messages)
        assert tokenizer.pad_token_id not in prompt_ids  # no unknown character

    score = 0.0
    for completion, mask, recorded, before, advantage, prompt in zip(
        out["completion_ids"],
        out["env_mask"],
        out["logprobs"],
        out["before"],
        out[ADVANTAGE],
        out["prompt_ids"],
        strict=True,
    ):
        assert mask == [1] * len(completion)  # single-turn: every token sampled
        # The endpoint's logprobs are the trained model's, token for token.
        assert torch.allclose(before, torch.tensor(recorded), atol=1e-4)
        after = _logprobs(model, prompt, completion)
        score += advantage * float((after - before).sum())
    assert any(a != 0 for a in out[ADVANTAGE])
    # The step moved the policy the way vfray's advantages say.
    assert score > 0
