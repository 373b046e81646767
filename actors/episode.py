"""Episodes as Ray tasks: ``run_episode`` receives the n finished rollouts of one task as
ObjectRef arguments (so it holds no worker while they run), runs the group rewards, and sends
the rows to the TraceSink; the driver gets back a small :class:`EpisodeOutcome`."""

from __future__ import annotations

import asyncio
from typing import Any

import pyarrow as pa
import ray
from pydantic import BaseModel, ConfigDict

from vfray.episode import Episode, finalize_episode
from vfray.task import Task
from vfray.trace import Trace
from vfray.traces.convert import traces_to_table
from vfray.traces.episodes import episodes_to_table


class RolloutOutcome(BaseModel):
    """What the driver needs to know about one finished rollout (its progress line)."""

    model_config = ConfigDict(frozen=True)

    ok: bool
    reward: float | None
    error_type: str | None
    stop_condition: str | None
    input_tokens: int
    output_tokens: int

    @classmethod
    def of(cls, trace: Trace) -> RolloutOutcome:
        err = trace.error()
        return cls(
            ok=trace.ok,
            reward=trace.reward,
            error_type=err.type if err else None,
            stop_condition=trace.stop_condition.value if trace.stop_condition else None,
            input_tokens=trace.usage.input_tokens,
            output_tokens=trace.usage.output_tokens,
        )


class EpisodeOutcome(BaseModel):
    """The driver's view of a finished episode; ``episode`` is filled only when streaming."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    episode_id: str
    task_key: str
    rollouts: list[RolloutOutcome]
    mean_reward: float | None
    episode: Episode | None = None


EpisodeRows = tuple[pa.Table, pa.Table]
"""An episode's new trace rows and its episode row, on their way to the TraceSink."""


def finish_episode(
    task: Task[Any],
    run_id: str | None,
    episode_id: str,
    overrides: dict[str, str],
    keep: bool,
    previous: list[Trace],
    *traces: Trace,
) -> tuple[EpisodeOutcome, EpisodeRows]:
    """Body of the ``run_episode`` Ray task. ``previous`` are a resumed group's rollouts that
    already succeeded: they take part in the group rewards but are not written again.

    The rows are returned, not sent: the driver hands their ObjectRef to the sink. A blocking
    ``ray.get`` on the sink inside this task would make Ray lend its CPU to another worker,
    which on a busy node means starting new worker processes over and over."""
    new = list(traces)
    episode = asyncio.run(
        finalize_episode(task, [*previous, *new], overrides, episode_id=episode_id)
    )
    episode.traces.sort(key=lambda t: t.rollout_index)
    outcome = EpisodeOutcome(
        episode_id=episode.episode_id,
        task_key=task.key,
        rollouts=[RolloutOutcome.of(t) for t in new],
        mean_reward=episode.mean_reward,
        episode=episode if keep else None,
    )
    return outcome, (traces_to_table(new), episodes_to_table([episode], run_id))


run_episode = ray.remote(num_cpus=0.5, max_retries=3, num_returns=2)(finish_episode)
"""The Ray task: ``outcome_ref, rows_ref = run_episode.remote(task, run_id, episode_id,
overrides, keep, previous, *rollout_refs)``. Half a CPU, not zero: zero-CPU tasks have no
concurrency cap, so Ray would start a worker process (~60 MB, ~0.5 s) per concurrently
finishing episode; with a cap, a few warm workers take them all. SandboxHosts reserve no
CPUs, so this never waits behind sandboxes."""
