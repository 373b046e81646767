"""Training on vfray's rollouts: token batches (``input_ids``, masks, advantages, old logprobs,
policy versions) built from the ``samples`` table, from a live :meth:`vfray.Farm.stream` or a
run folder. numpy only; the torch datasets are in :mod:`vfray.train.torch` (the ``train``
extra)."""

from vfray.train.batch import Batch, BatchStats, build_batch
from vfray.train.loader import group_samples, iter_batches, read_samples, stream_batches

__all__ = [
    "Batch",
    "BatchStats",
    "build_batch",
    "group_samples",
    "iter_batches",
    "read_samples",
    "stream_batches",
]
