"""GRPO on vfray, end to end: a tiny character-level policy (``policy.py``) trained from scratch
on rollouts that ``Farm.stream`` runs through its own OpenAI-compatible endpoint.

The task: the prompt is a digit, the reply should be the next digit and nothing else ("7" ->
"8", "9" -> "0"). A random policy scores ~0.05. Each step takes one batch of whole groups from
:class:`vfray.train.torch.StreamDataset`, recomputes the sampled tokens' logprobs, takes a few
clipped policy-gradient steps with vfray's group advantages (plus a small entropy bonus, so a
prompt whose group is all wrong is not abandoned), and tells the farm the new policy version.

    python examples/rl/grpo.py --steps 40 --plot examples/rl/reward_curve.png

Runs on a GPU unchanged when one is there (``--device cuda`` is picked automatically).
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import vfray as vf
from vfray.train.torch import StreamDataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from policy import OUTPUTS, CharPolicy, serve_policy


class NextDigit(vf.TaskData):
    answer: str


class NextDigitTask(vf.Task[NextDigit]):
    @vf.reward
    def correct(self, trace: vf.Trace) -> float:
        """1 for exactly the next digit, 0.5 when it is followed by more characters."""
        reply = trace.last_reply or ""
        return 1.0 if reply == self.data.answer else 0.5 * reply.startswith(self.data.answer)


def tasks(seed: int = 0) -> Iterator[NextDigitTask]:
    """Endless prompts, each a random digit (keys unique per draw)."""
    rng = random.Random(seed)
    for i in itertools.count():
        d = rng.randrange(10)
        yield NextDigitTask(NextDigit(prompt=str(d), answer=str((d + 1) % 10)), key=f"{i}:{d}")


@dataclass
class History:
    rewards: list[float] = field(default_factory=list)
    versions: list[float] = field(default_factory=list)
    first_mismatch: float | None = None
    seconds: float = 0.0
    samples: int = 0


def update(
    policy: CharPolicy,
    optimizer: torch.optim.Optimizer,
    batch: dict[str, Any],
    lock: threading.Lock,
    *,
    epochs: int = 4,
    clip: float = 0.2,
    entropy: float = 0.02,
) -> tuple[torch.Tensor, float]:
    """``epochs`` clipped policy-gradient steps on one batch; the last loss, and how far the
    policy's logprobs of the sampled tokens were from the inference logprobs before the first
    step (0 up to float error when the batch was sampled with these weights)."""
    ids, sampled = batch["input_ids"], batch["loss_mask"].bool()
    # The endpoint's logprobs: the behaviour policy's, for the importance ratio.
    mask, behaviour = sampled.float(), batch["inference_logprobs"]
    adv = batch["advantages"][:, None]
    mismatch = 0.0
    for epoch in range(epochs):
        logprobs, _state = policy(ids)
        # Off the sampled tokens (prompt, padding) the masked policy gives -inf.
        picked = logprobs[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
        new = torch.where(sampled[:, 1:], picked, behaviour[:, 1:])
        if epoch == 0:
            mismatch = float((new.detach() - behaviour[:, 1:]).abs().max())
        ratio = torch.exp(new - behaviour[:, 1:])
        clipped = torch.clamp(ratio, 1 - clip, 1 + clip)
        surrogate = torch.minimum(ratio * adv, clipped * adv)
        # The entropy of the distributions the sampled tokens were drawn from.
        dist = logprobs[:, :-1, OUTPUTS]
        ent = -(dist.exp() * dist).sum(-1)
        weight = mask[:, 1:]
        loss = -((surrogate + entropy * ent) * weight).sum() / weight.sum().clamp(min=1)
        optimizer.zero_grad()
        loss.backward()
        with lock:  # the endpoint never samples from half-updated weights
            optimizer.step()
    return loss, mismatch


def train(
    steps: int = 40,
    groups_per_step: int = 16,
    group_size: int = 4,
    lr: float = 1e-2,
    epochs: int = 4,
    entropy: float = 0.02,
    clip: float = 0.2,
    backend: str = "local",
    device: str | None = None,
    output_dir: str = "outputs",
    seed: int = 0,
    log: bool = True,
) -> History:
    torch.manual_seed(seed)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    policy = CharPolicy().to(device)
    optimizer = torch.optim.Adam(policy.parameters(), lr=lr)
    lock = threading.Lock()
    history = History()
    start = time.monotonic()
    with (
        serve_policy(policy, lock, seed) as url,
        vf.Farm(
            "char-policy",
            base_url=url,
            harness="null",
            runtime="subprocess",
            backend=backend,
            max_concurrent=groups_per_step * group_size,
            sampling={"max_tokens": 4, "temperature": 1.0},
            output_dir=output_dir,
            progress=False,
        ) as farm,
    ):
        farm.set_policy_version(0)
        batches = StreamDataset(
            farm, tasks(seed), group_size, groups_per_step * group_size, device=device
        )
        for step, batch in enumerate(batches):
            loss, mismatch = update(
                policy, optimizer, batch, lock, epochs=epochs, clip=clip, entropy=entropy
            )
            if history.first_mismatch is None:
                history.first_mismatch = mismatch
            farm.set_policy_version(step + 1)
            reward = float(batch["rewards"].nanmean())
            history.rewards.append(reward)
            history.versions.append(float(batch["policy_version"].float().mean()))
            history.samples += len(batch["lengths"])
            if log:
                print(
                    f"step {step:3d}  reward {reward:.3f}  samples {len(batch['lengths'])}  "
                    f"policy version {history.versions[-1]:.1f}  loss {loss.item():+.4f}",
                    flush=True,
                )
            if step + 1 == steps:
                break
    history.seconds = time.monotonic() - start
    return history


def plot(history: History, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.2), dpi=120)
    ax.plot(range(len(history.rewards)), history.rewards, marker=".", lw=1)
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("mean reward of the step's batch")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.set_title(
        f"vfray GRPO, char-level policy ({history.seconds:.0f} s, {history.samples} rollouts)"
    )
    fig.tight_layout()
    fig.savefig(path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--groups-per-step", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--backend", default="local", choices=["local", "ray"])
    parser.add_argument("--device", default=None)
    parser.add_argument("--output-dir", default="outputs")
    parser.add_argument("--plot", default=None, help="save the reward curve (PNG) here")
    parser.add_argument("--json", default=None, help="save the per-step rewards here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # a tiny model: threads only fight the farm for the cores
    history = train(
        args.steps,
        args.groups_per_step,
        args.group_size,
        args.lr,
        backend=args.backend,
        device=args.device,
        output_dir=args.output_dir,
    )
    first, last = history.rewards[:5], history.rewards[-5:]
    print(
        f"logprob mismatch before the first update: {history.first_mismatch:.2e}\n"
        f"reward {sum(first) / len(first):.3f} (first 5 steps) -> "
        f"{sum(last) / len(last):.3f} (last 5) in {history.seconds:.0f} s, "
        f"{history.samples} rollouts",
        flush=True,
    )
    if args.plot:
        plot(history, args.plot)
    if args.json:
        data: dict[str, Any] = {
            "rewards": history.rewards,
            "seconds": history.seconds,
            "rollouts": history.samples,
            "first_mismatch": history.first_mismatch,
        }
        Path(args.json).write_text(json.dumps(data, indent=1))


if __name__ == "__main__":
    main()
