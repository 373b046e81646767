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


def group_samples(group: EpisodeGroup, *, on_prefix_break: str | None = None) -> pa.Table:
    """The samples of one streamed group (straight from its traces, no table round trip);
    ``on_prefix_break`` as in :func:`vfray.to_samples`, by default the run's own
    (``env.on_prefix_break``, carried on the group)."""
    from vfray.traces.samples import to_samples

    chosen = group.on_prefix_break if on_prefix_break is None else on_prefix_break
    return to_samples(group.traces, on_prefix_break=chosen)


def uniform_group(group: EpisodeGroup) -> bool:
    """Whether every rollout that counts in a trainable group got the same reward: all its
    advantages are 0, whatever the estimator, so it carries no policy gradient."""
    episode = group.episode
    if not episode.trainable:
        return False
    rewards = {r for r, c in zip(episode.rewards, episode.counted, strict=True) if c}
    return len(rewards) == 1


async def stream_batches(
    groups: AsyncIterable[EpisodeGroup],
    batch_size: int,
    *,
    dynamic_sampling: bool = False,
    on_prefix_break: str | None = None,
    **build: Any,
) -> AsyncIterator[Batch]:
    """Batches of at least ``batch_size`` usable samples, made of whole groups (a GRPO batch
    keeps a group's rollouts together); ``build`` goes to :func:`build_batch`. A last,
    smaller batch is yielded when the stream ends.

    ``dynamic_sampling`` (DAPO's): a group whose counted rollouts all got the same reward
    (:func:`uniform_group`: all right or all wrong) is dropped before it takes room in a
    batch, so every batch is filled with groups that carry a signal; the next batch's
    ``stats.uniform_groups`` counts those dropped.

    ``on_prefix_break``: a branch whose ids do not line up is left out (``"drop"``, counted in
    ``stats``) or trained on as one sample per turn (``"per_turn"``); by default as the run's
    config says (``env.on_prefix_break``, carried on each group ``Farm.stream`` yields)."""
    from vfray.traces.samples import ON_PREFIX_BREAK

    if on_prefix_break is not None and on_prefix_break not in ON_PREFIX_BREAK:
        choices = ", ".join(ON_PREFIX_BREAK)
        raise ValueError(f"on_prefix_break must be one of {choices}, got {on_prefix_break!r}")
    pending: list[pa.Table] = []
    usable = uniform = 0
    async for group in groups:
        if dynamic_sampling and uniform_group(group):
            uniform += 1
            continue
        samples = group_samples(group, on_prefix_break=on_prefix_break)
        pending.append(samples)
        usable += int(pc.sum(pc.is_valid(samples.column("advantage"))).as_py() or 0)
        if usable >= batch_size:
            batch = build_batch(pa.concat_tables(pending), **build)
            batch.stats.uniform_groups = uniform
            yield batch
            pending, usable, uniform = [], 0, 0
    if pending and usable:
        batch = build_batch(pa.concat_tables(pending), **build)
        batch.stats.uniform_groups = uniform
        yield batch


def read_samples(
    run_dir: str | os.PathLike[str], *, on_prefix_break: str | None = None
) -> pa.Table:
    """The samples of a run folder's final traces (the last attempt of each rollout). A branch
    whose ids do not line up is dropped or split per turn as ``on_prefix_break`` says, by
    default as the run's own config did (``env.on_prefix_break``, ``"drop"`` when unset). For
    sets larger than memory, read ``<run>/traces`` with Ray Data (``ray.data.read_parquet``)
    and call :func:`vfray.to_samples` per block."""
    from vfray.run.results import RunResult
    from vfray.traces.samples import to_samples

    result = RunResult(run_dir)
    if on_prefix_break is None:
        on_prefix_break = _configured_on_prefix_break(result.run_dir)
    return to_samples(result.final_traces, on_prefix_break=on_prefix_break)


def _configured_on_prefix_break(run_dir: os.PathLike[str]) -> str:
    import json
    from pathlib import Path

    path = Path(run_dir) / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return "drop"  # a folder written without a config (to_parquet): the default
    env = config.get("env") if isinstance(config, dict) else None
    value = env.get("on_prefix_break") if isinstance(env, dict) else None
    return value if isinstance(value, str) else "drop"


def iter_batches(
    samples: pa.Table, batch_size: int, *, shuffle_seed: int | None = None, **build: Any
) -> Iterator[Batch]:
    """Batches of ``batch_size`` rows of ``samples`` (zero-copy slices; a last smaller one),
    in order or shuffled with ``shuffle_seed``; ``build`` goes to :func:`build_batch`.

    Refuses, in one line, samples none of which has token ids because nothing asked for them
    (a ``farm.run`` without ``sampling.return_tokens``): every batch would be empty."""
    untokenised = samples.column("prompt_token_ids").null_count
    if samples.num_rows and untokenised == samples.num_rows:
        reasons = pc.fill_null(samples.column("token_error"), "missing")
        if pc.all(pc.equal(reasons, "missing")).as_py():
            raise ValueError(
                f"none of the {samples.num_rows} samples has token ids: the run did not ask the "
                "endpoint for them (farm.run evaluates; run with "
                "sampling={'return_tokens': True}, or train from farm.stream())"
            )
    if shuffle_seed is not None:
        import numpy as np

        order = np.random.default_rng(shuffle_seed).permutation(samples.num_rows)
        samples = samples.take(pa.array(order))
    for start in range(0, samples.num_rows, batch_size):
        yield build_batch(samples.slice(start, batch_size), **build)
