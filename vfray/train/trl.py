"""TRL's ``GRPOTrainer`` with vfray as its rollout side: :class:`TRLRollouts` is the trainer's
``rollout_func``. Each generation step runs the step's tasks as groups through
:meth:`vfray.Farm.stream` (any harness, runtime, multi-turn agent) and hands TRL the exact
tokens the endpoint saw and sampled.

What goes where, per completion TRL asks for:

- ``prompt_ids``: the branch's first prompt, as the endpoint tokenised it;
- ``completion_ids``: every token after it, model-sampled and environment-inserted alike;
- ``env_mask``: the sample's ``completion_mask`` (1 on sampled tokens, 0 on tool results and
  other inserted tokens; TRL multiplies it into its loss mask);
- ``logprobs``: the inference engine's logprobs of those tokens (TRL uses them for its
  importance-sampling correction when it runs with vLLM; without vLLM it recomputes its own);
- ``vfray_reward`` and ``vfray_advantage`` (passed on to the reward functions): the rollout's
  reward and the advantage of vfray's estimator (``env.advantage``); None where the rollout does
  not count (an infrastructure failure) or cannot be trained on.

With ``reward_funcs=[vfray_advantage]`` and ``GRPOConfig(scale_rewards="none")`` TRL's own
advantage is vfray's exactly: vfray's advantages have a group mean of 0, so TRL's centring
leaves them as they are; a None becomes NaN there, which TRL leaves out of the group baseline
and trains with advantage 0.

The dataset rows are task keys (``{"prompt": key}``, :meth:`TRLRollouts.dataset`): TRL only
passes prompts to a ``rollout_func``, and the key names the task, its data and its scoring
exactly, where two tasks may share a prompt text. TRL's sampler repeats each row
``num_generations`` times in a row; each run of repeats is one vfray group.

A rollout gives TRL one completion. A rollout that did not give one trainable sample (it
failed, its tokens did not line up, or it has several branches: sub-agents, compactions) gets a
one-token placeholder that is masked out (``env_mask`` 0) with advantage None, counted in
:attr:`TRLRollouts.placeholders`; train those on vfray's own batches
(:func:`vfray.train.stream_batches`), which keep every branch.

numpy and pyarrow only: TRL and torch are never imported here (``datasets`` only by
:meth:`TRLRollouts.dataset`).

Internal: importable, but not the public API (:mod:`vfray`, :mod:`vfray.testing`,
:mod:`vfray.train`, :mod:`vfray.compat.v1`); names here may move.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from vfray._sync import run_sync
from vfray.train.loader import group_samples

if TYPE_CHECKING:
    from vfray.farm import Farm
    from vfray.run.outcomes import EpisodeGroup
    from vfray.task import Task

log = logging.getLogger(__name__)

REWARD = "vfray_reward"
ADVANTAGE = "vfray_advantage"


def vfray_advantage(completions: list[Any], **kwargs: Any) -> list[float | None]:
    """A TRL reward function giving each completion vfray's advantage (None: not counted).
    Use with ``GRPOConfig(scale_rewards="none")`` so TRL trains on these advantages as they
    are."""
    return [None if a is None else float(a) for a in kwargs[ADVANTAGE]]


def vfray_reward(completions: list[Any], **kwargs: Any) -> list[float | None]:
    """A TRL reward function giving each completion its vfray reward (TRL then computes its
    own group advantages from them)."""
    return [None if r is None else float(r) for r in kwargs[REWARD]]


class TRLRollouts:
    """``GRPOTrainer(..., rollout_func=TRLRollouts(farm, tasks, num_generations=G))``.

    ``num_generations`` must equal the trainer's. Before each generation step the farm's
    policy version is set to the trainer's ``global_step``, so every call records the weights
    it was sampled with."""

    def __init__(
        self, farm: Farm, tasks: Iterable[Task[Any]], *, num_generations: int, name: str = "trl"
    ) -> None:
        if num_generations < 2:
            raise ValueError(f"num_generations must be at least 2 (a group), got {num_generations}")
        self.farm, self.num_generations, self.name = farm, num_generations, name
        self.tasks: dict[str, Task[Any]] = {}
        for task in tasks:
            if task.key in self.tasks:
                raise ValueError(f"two tasks have the key {task.key!r}; keys name the rows")
            self.tasks[task.key] = task
        self.placeholders: Counter[str] = Counter()
        """Completions handed to TRL as masked placeholders, by reason."""
        self.groups: list[EpisodeGroup] = []
        """The last generation step's groups, in the order TRL asked for them."""

    def dataset(self) -> Any:
        """The train dataset: one row per task, ``{"prompt": key}`` (a ``datasets.Dataset``)."""
        from datasets import Dataset

        return Dataset.from_list([{"prompt": key} for key in self.tasks])

    def __call__(self, prompts: list[Any], trainer: Any = None) -> dict[str, list[Any]]:
        """Run the prompts' tasks, one group of ``num_generations`` rollouts each; the
        completions in the order of ``prompts``."""
        n = self.num_generations
        if len(prompts) % n:
            raise ValueError(
                f"{len(prompts)} prompts is not a whole number of groups of {n}: "
                "num_generations differs from the trainer's"
            )
        keys = [prompts[i] for i in range(0, len(prompts), n)]
        for start, key in zip(range(0, len(prompts), n), keys, strict=True):
            if not isinstance(key, str) or key not in self.tasks:
                raise ValueError(f"prompt {key!r} is not a task key (use TRLRollouts.dataset())")
            if any(p != key for p in prompts[start : start + n]):
                raise ValueError(f"the rows of task {key!r} are not {n} repeats in a row")
        if len(set(keys)) != len(keys):
            raise ValueError("a generation batch holds the same task twice; use a larger dataset")
        if trainer is not None:
            self.farm.set_policy_version(int(trainer.state.global_step))
        filler = _filler_token(trainer)
        groups = self._run([self.tasks[k] for k in keys])
        self.groups = [groups[k] for k in keys if k in groups]
        out: dict[str, list[Any]] = {
            name: []
            for name in ("prompt_ids", "completion_ids", "logprobs", "env_mask", REWARD, ADVANTAGE)
        }
        for key in keys:
            rows = _rollout_rows(groups.get(key), n)
            for row in rows:
                if isinstance(row, str):
                    self.placeholders[row] += 1
                    row = {
                        "prompt_token_ids": [filler],
                        "completion_token_ids": [filler],
                        "completion_logprobs": [0.0],
                        "completion_mask": [0],
                        "reward": None,
                        "advantage": None,
                    }
                out["prompt_ids"].append(list(row["prompt_token_ids"]))
                out["completion_ids"].append(list(row["completion_token_ids"]))
                out["logprobs"].append([float(x) for x in row["completion_logprobs"]])
                out["env_mask"].append([int(x) for x in row["completion_mask"]])
                out[REWARD].append(row["reward"])
                out[ADVANTAGE].append(row["advantage"])
        return out

    def _run(self, tasks: list[Task[Any]]) -> dict[str, EpisodeGroup]:
        # The stream and the farm's start belong on the caller's thread (Ray's signal
        # handlers); the stream then runs on run_sync's loop.
        stream = self.farm.stream(tasks, self.num_generations, name=self.name)
        self.farm._start()

        async def collect() -> dict[str, EpisodeGroup]:
            groups: dict[str, EpisodeGroup] = {}
            async for group in stream:
                groups[group.episode.task.key] = group
            return groups

        return run_sync(collect(), self.farm.config.farm.event_loop)


def _filler_token(trainer: Any) -> int:
    tokenizer = getattr(trainer, "processing_class", None)
    for name in ("pad_token_id", "eos_token_id"):
        token = getattr(tokenizer, name, None)
        if isinstance(token, int):
            return token
    return 0


def _rollout_rows(group: EpisodeGroup | None, n: int) -> list[dict[str, Any] | str]:
    """One row per rollout index ``0..n-1``: its sample, or why it has none."""
    if group is None:
        return ["no_group"] * n
    table = group_samples(group).to_pylist()
    by_rollout: dict[int, list[dict[str, Any]]] = {}
    for row in table:
        by_rollout.setdefault(int(row["rollout_index"]), []).append(row)
    out: list[dict[str, Any] | str] = []
    for index in range(n):
        rows = by_rollout.get(index, [])
        if not rows:
            out.append("no_sample")
        elif len(rows) > 1:
            out.append("branches")
        elif rows[0]["token_error"] is not None or rows[0]["prompt_token_ids"] is None:
            out.append(rows[0]["token_error"] or "missing")
        elif rows[0]["completion_logprobs"] is None:
            out.append("no_logprobs")
        elif rows[0]["advantage"] is None:
            # Not counted (an infrastructure failure): no policy signal, never trained on.
            out.append("no_advantage")
        else:
            out.append(rows[0])
    return out
