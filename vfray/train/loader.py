"""Batches for a trainer: from a live :meth:`vfray.Farm.stream` (whole groups, as they are
scored) or from a run folder's Parquet traces (offline), both through :func:`build_batch`.

Internal: importable, but not the public API (:mod:`vfray`, :mod:`vfray.testing`,
:mod:`vfray.train`, :mod:`vfray.compat.v1`); names here may move."""

from __future__ import annotations

import os
from collections.abc import AsyncIterable, AsyncIterator, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from vfray.run.outcomes import EpisodeGroup
from vfray.train.batch import Batch, build_batch


def group_samples(group: EpisodeGroup) -> pa.Table:
    """The samples of one streamed group (straight from its traces, no table round trip)."""
    from vfray.traces.samples import to_samples

    return to_samples(group.traces)


async def stream_batches(
    groups: AsyncIterable[EpisodeGroup], batch_size: int, **build: Any
) -> AsyncIterator[Batch]:
    """Batches of at least ``batch_size`` usable samples, made of whole groups (a GRPO batch
    keeps a group's rollouts together); ``build`` goes to :func:`build_batch`. A last,
    smaller batch is yielded when the stream ends."""
    pending: list[pa.Table] = []
    usable = 0
    async for group in groups:
        samples = group_samples(group)
        pending.append(samples)
        usable += int(pc.sum(pc.is_valid(samples.column("advantage"))).as_py() or 0)
        if usable >= batch_size:
            yield build_batch(pa.concat_tables(pending), **build)
            pending, usable = [], 0
    if pending and usable:
        yield build_batch(pa.concat_tables(pending), **build)


def read_samples(run_dir: str | os.PathLike[str]) -> pa.Table:
    """The samples of a run folder's final traces (the last attempt of each rollout). For sets
    larger than memory, read ``<run>/traces`` with Ray Data (``ray.data.read_parquet``) and
    call :func:`vfray.to_samples` per block."""
    from vfray.run.results import RunResult
    from vfray.traces.samples import to_samples

    return to_samples(RunResult(run_dir).final_traces)


def iter_batches(
    samples: pa.Table, batch_size: int, *, shuffle_seed: int | None = None, **build: Any
) -> Iterator[Batch]:
    """Batches of ``batch_size`` rows of ``samples`` (zero-copy slices; a last smaller one),
    in order or shuffled with ``shuffle_seed``; ``build`` goes to :func:`build_batch`."""
    if shuffle_seed is not None:
        import numpy as np

        order = np.random.default_rng(shuffle_seed).permutation(samples.num_rows)
        samples = samples.take(pa.array(order))
    for start in range(0, samples.num_rows, batch_size):
        yield build_batch(samples.slice(start, batch_size), **build)
