"""TRL's ``GRPOTrainer`` with vfray as its ``rollout_func`` (:mod:`vfray.train.trl`), one real
training step on CPU: the example's tiny random-weight Llama (``examples/rl/trl_grpo.py``) is
served to the interception, ``Farm.stream`` runs the step's groups of two-turn conversations,
and TRL trains on what came back.

Checked: the tokens and logprobs TRL got are the served policy's (recomputed by the trainer's
model before the step, they match on every sampled token); both turns are in one sample, the
user's tokens between them masked out (``env_mask``); the masks and vfray's advantages reach
TRL's loss (after the step, the advantage-weighted change of the samples' logprobs is positive:
a lost, zeroed or negated advantage fails it); a group that does not count (its scorer fails)
reaches TRL as masked placeholders with no advantage; bad prompts are refused in one line.
Skipped without the ``train`` extra's ``trl``."""

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


def _broken(ex: Any) -> Any:
    """A task whose scorer fails: its rollouts do not count, so they carry no advantage."""
    import vfray as vf

    class Broken(ex.DigitsTask):  # type: ignore[misc, name-defined]
        @vf.reward
        def digits(self, trace: vf.Trace) -> float:
            raise RuntimeError("the scorer is broken")

    return Broken(ex.Digits(prompt="1"), key="broken")


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
        ex.make_farm(url, (GROUPS + 1) * GENERATIONS, str(tmp_path)) as farm,
    ):
        tasks = [*ex.tasks(GROUPS, turns=2), _broken(ex)]
        rollouts = TRLRollouts(farm, tasks, num_generations=GENERATIONS)

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
            args=ex.grpo_config(
                str(tmp_path / "trl"), 1, GENERATIONS, GROUPS + 1, reward_weights=None
            ),
            train_dataset=rollouts.dataset(),
            processing_class=tokenizer,
            rollout_func=rollout_func,
        )
        trainer.train()

        with pytest.raises(ValueError, match="not a whole number of groups"):
            rollouts(["digits-0"] * (GENERATIONS - 1))
        with pytest.raises(ValueError, match="is not a task key"):
            rollouts(["nope"] * GENERATIONS)

    # The broken task's rollouts do not count: TRL got masked placeholders, advantage None.
    assert len(seen) == 1 and rollouts.placeholders == {"no_advantage": GENERATIONS}
    out = dict(seen[0])
    broken = [i for i, key in enumerate(out["keys"]) if key == "broken"]
    assert len(broken) == GENERATIONS
    for i in broken:
        assert out["env_mask"][i] == [0] and out[ADVANTAGE][i] is None
    out = {k: [x for i, x in enumerate(v) if i not in broken] for k, v in out.items()}
    assert len(out["prompt_ids"]) == GROUPS * GENERATIONS
    # Each group's rollouts are one vfray group, its prompt the endpoint's own rendering.
    assert len(rollouts.groups) == GROUPS + 1
    for group in rollouts.groups:
        assert len(group.traces) == GENERATIONS
    for key, prompt_ids in zip(out["keys"], out["prompt_ids"], strict=True):
        messages = [{"role": "user", "content": rollouts.tasks[key].data.prompt}]
        assert prompt_ids == ex.encode_chat(tokenizer, messages)
        assert tokenizer.pad_token_id not in prompt_ids  # no unknown character
    # The second turn's user message, as the template renders it between the replies.
    more = ex.encode_chat(tokenizer, [{"role": "user", "content": "more"}])

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
        # Two replies, the user's turn between them inserted (mask 0), its tokens the template's.
        inserted = [t for t, m in zip(completion, mask, strict=True) if not m]
        assert inserted[-len(more) :] == more and 0 < len(inserted) <= len(more) + 1
        assert 0 < sum(mask) < len(completion)
        sampled = torch.tensor(mask, dtype=torch.bool)
        # The endpoint's logprobs are the trained model's, token for token (up to the float
        # error of a forward pass over another length: ~5e-4 seen here).
        assert torch.allclose(before[sampled], torch.tensor(recorded)[sampled], atol=2e-3)
        after = _logprobs(model, prompt, completion)
        score += advantage * float((after - before)[sampled].sum())
    assert any(a != 0 for a in out[ADVANTAGE])
    # The step moved the policy the way vfray's advantages say.
    assert score > 0
