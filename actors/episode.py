"""Episodes as Ray tasks: ``run_episode`` receives the n finished rollouts of one task as
ObjectRef arguments (so it holds no worker while they run), runs the group rewards, and returns
the rows for the TraceSink; the driver gets back a small
:class:`~vfray.run.outcomes.EpisodeOutcome`."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import ray

from vfray.run.outcomes import EpisodeJob, EpisodeOutcome, finish_episode
from vfray.trace import Trace

if TYPE_CHECKING:
    from vfray.traces.wire import PackedRows


def finish_episode_sync(
    job: EpisodeJob, *traces: Trace | list[Trace]
) -> tuple[EpisodeOutcome, PackedRows]:
    """Body of the ``run_episode`` Ray task (Ray resolves the rollout refs into ``traces``: a
    list per game of a seated task).

    The rows are returned (as IPC bytes, :mod:`vfray.traces.wire`), not sent: the driver hands
    their ObjectRef to the sink. A blocking
    ``ray.get`` on the sink inside this task would make Ray lend its CPU to another worker,
    which on a busy node means starting new worker processes over and over."""
    from vfray.traces.wire import pack_rows  # pyarrow: imported by the first episode only

    outcome, rows = asyncio.run(finish_episode(job, list(traces)))
    return outcome, pack_rows(rows)


run_episode = ray.remote(num_cpus=0.5, max_retries=3, num_returns=2)(finish_episode_sync)
"""The Ray task: ``outcome_ref, rows_ref = run_episode.remote(job, *rollout_refs)``. Half a
CPU, not zero: zero-CPU tasks have no concurrency cap, so Ray would start a worker process
(~60 MB, ~0.5 s) per concurrently finishing episode; with a cap, a few warm workers take them
all. SandboxHosts reserve no CPUs, so this never waits behind sandboxes."""
