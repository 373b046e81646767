"""Token batches from the ``samples`` table (:func:`vfray.to_samples`), Arrow to numpy with no
per-row Python: the list columns' flat values are placed by boolean masks (or, where samples
are cut or left out, by offset arithmetic).

One sample is one branch: its prompt then its completion tokens. ``loss_mask`` is 1 on the
tokens the model sampled (never on the prompt, nor on tokens the environment inserted between
turns); ``inference_logprobs`` are the inference engine's logprobs of those tokens, at the same
positions.

The names trainers use, per sample: ``group_ids`` (the episode id: verl's ``uid``, the group a
GRPO baseline is taken over), ``trace_ids`` (one per rollout attempt: SkyRL's ``TrajectoryID``;
with ``rollout_index`` the repetition within the group), ``finish_reasons`` and ``truncated``
(the sequence has no natural end: an endpoint call stopped at its token limit, or
``max_length`` cut it here), and ``response_mask`` (verl's name for ``loss_mask``; SkyRL's
``loss_masks``).

Internal: importable, but not the public API (:mod:`vfray`, :mod:`vfray.testing`,
:mod:`vfray.train`, :mod:`vfray.compat.v1`); names here may move.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
from numpy.lib.stride_tricks import sliding_window_view

Layout = Literal["padded", "packed"]
Overflow = Literal["truncate", "drop"]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float32]


@dataclass
class BatchStats:
    """What happened to the samples a batch was built from; the counts add up to ``samples``."""

    samples: int = 0
    used: int = 0
    no_advantage: int = 0
    """Left out: the rollout does not count in its group (an infrastructure failure, or a group
    with fewer than 2 counted rollouts): no policy signal."""
    token_errors: dict[str, int] = field(default_factory=dict)
    """Left out, by ``token_error`` (``missing``, ``prefix_break``): never repaired."""
    no_logprobs: int = 0
    """Left out: token ids but no logprobs (nothing to take a ratio against)."""
    too_long: int = 0
    """Left out: longer than ``max_length`` with ``overflow="drop"``."""
    truncated: int = 0
    """Used, cut at ``max_length`` (``overflow="truncate"``)."""
    uniform_groups: int = 0
    """Groups left out before this batch by dynamic sampling (:func:`vfray.train.stream_batches`
    with ``dynamic_sampling=True``): every counted rollout had the same reward."""

    def add(self, other: BatchStats) -> None:
        self.samples += other.samples
        self.used += other.used
        self.no_advantage += other.no_advantage
        for kind, n in other.token_errors.items():
            self.token_errors[kind] = self.token_errors.get(kind, 0) + n
        self.no_logprobs += other.no_logprobs
        self.too_long += other.too_long
        self.truncated += other.truncated
        self.uniform_groups += other.uniform_groups


@dataclass
class Batch:
    """Numpy arrays of one training batch. ``padded``: shape ``[B, L]``, right padding.
    ``packed``: one row ``[1, T]`` holding every sample back to back, ``position_ids``
    restarting at 0 per sample and ``cu_seqlens`` (``[B + 1]``) marking where each starts, as
    variable-length attention kernels take them. The six per-position arrays are views of one
    allocation, freed when none of them is referenced any more."""

    input_ids: IntArray
    attention_mask: IntArray
    loss_mask: IntArray
    inference_logprobs: FloatArray
    """Per position: the logprob the inference engine (vLLM, ...) gave the sampled token when
    it sampled it (0 off the loss mask). These are the *behaviour* policy's logprobs, not the
    trainer's: a trainer recomputes its own old logprobs with its own weights and kernels and
    uses these for importance-sampling correction (the train/inference mismatch, TIS) and to
    watch how far the two drift. Also readable as ``old_logprobs`` (the name before)."""
    advantages: FloatArray
    """One per sample (``[B]``); every sampled token of a sample shares it."""
    rewards: FloatArray
    """One per sample (``[B]``): its rollout's reward (NaN: none), for logging."""
    policy_version: IntArray
    """One per sample: the oldest policy version among its model calls (-1: not stamped)."""
    position_ids: IntArray
    lengths: IntArray
    """Tokens per sample after truncation (``[B]``)."""
    cu_seqlens: IntArray
    layout: Layout
    trace_ids: npt.NDArray[np.object_]
    """One per sample: the rollout attempt it came from (a trajectory id)."""
    stats: BatchStats
    group_ids: npt.NDArray[np.object_] = field(default_factory=lambda: np.empty(0, dtype=object))
    """One per sample: its group (episode id; verl's ``uid``). None for a trace that was never
    part of a group."""
    rollout_index: IntArray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    """One per sample: its rollout's index within the group."""
    finish_reasons: npt.NDArray[np.object_] = field(
        default_factory=lambda: np.empty(0, dtype=object)
    )
    """One per sample: the finish_reason of its last model call (``stop``, ``length``, ...)."""
    truncated: npt.NDArray[np.bool_] = field(default_factory=lambda: np.empty(0, dtype=bool))
    """One per sample: no natural end, so no EOS to learn from: a call of it stopped at its
    token limit (finish_reason ``length``) or ``max_length`` cut it here (DAPO masks or
    penalises such samples: the overlong filter)."""
    token_level_rewards: FloatArray = field(
        default_factory=lambda: np.zeros((0, 0), dtype=np.float32)
    )
    """Same shape as ``input_ids``: the task's per-turn rewards
    (:meth:`vfray.Trace.set_turn_reward`) on each turn's last sampled token, 0 elsewhere
    (verl's ``token_level_rewards``, SkyRL's per-token ``rewards``). All 0 when the task gives
    none; the outcome reward is ``rewards`` (verl adds it at the last response token)."""

    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def response_mask(self) -> IntArray:
        """``loss_mask`` under verl's name (the same array, over the full sequence: not verl's
        response-only slice)."""
        return self.loss_mask

    @property
    def old_logprobs(self) -> FloatArray:
        """``inference_logprobs`` under the name it had first."""
        return self.inference_logprobs

    @property
    def uid(self) -> npt.NDArray[np.object_]:
        """``group_ids`` under verl's name."""
        return self.group_ids

    @property
    def sample_index(self) -> IntArray:
        """Per position: which sample it belongs to (padding: its row's sample)."""
        if self.layout == "padded":
            return np.broadcast_to(
                np.arange(len(self), dtype=np.int64)[:, None], self.input_ids.shape
            )
        counts = np.diff(self.cu_seqlens)
        return np.repeat(np.arange(len(self), dtype=np.int64), counts)[None, :]

    def token_advantages(self) -> FloatArray:
        """The sample's advantage at every position, 0 off the loss mask."""
        return (self.advantages[self.sample_index] * self.loss_mask).astype(np.float32)


def _lists(column: pa.ChunkedArray | pa.Array) -> tuple[npt.NDArray[np.int64], npt.NDArray[Any]]:
    """A list column's offsets (rebased at 0) and flat values, as numpy (zero-copy: list
    values have no nulls)."""
    if isinstance(column, pa.ChunkedArray):
        arr = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    else:
        arr = column
    offsets = np.asarray(arr.offsets, dtype=np.int64)
    values = arr.values.slice(offsets[0], offsets[-1] - offsets[0])
    return offsets - offsets[0], values.to_numpy(zero_copy_only=False)


def _column(
    rows: pa.Table, name: str, fill: float | int | bool, dtype: type[np.generic]
) -> npt.NDArray[Any]:
    """A scalar column as numpy, nulls as ``fill`` (``fill_null`` only where there are some:
    it costs as much as the rest of a small batch's scalar columns)."""
    column = rows.column(name)
    if column.null_count:
        column = pc.fill_null(column, pa.scalar(fill, type=column.type))
    # A copy (one value a sample): a column already of ``dtype`` converts without one, to a
    # read-only view of Arrow's buffer, which a trainer's CPU tensor would then share.
    return np.array(column.to_numpy(), dtype=dtype)


def _per_position(
    size: int,
) -> tuple[IntArray, IntArray, IntArray, IntArray, FloatArray, FloatArray]:
    """A batch's per-position arrays (four int64: input ids, loss mask, attention mask,
    positions; two float32: logprobs, token rewards), uninitialised, as views of one
    allocation. Why one: once a block is freed, glibc serves blocks up to its size (at most
    32 MB) from its heap and keeps twice that before giving memory back, so the one block is
    reused by the next batch, where six separate ones added up past that and were handed back
    and page-faulted in again every batch (half the time of a batch of 64)."""
    buffer = np.empty(40 * size, dtype=np.uint8)
    ints = [buffer[i * 8 * size : (i + 1) * 8 * size].view(np.int64) for i in range(4)]
    floats = [buffer[(32 + i * 4) * size : (36 + i * 4) * size].view(np.float32) for i in (0, 1)]
    return ints[0], ints[1], ints[2], ints[3], floats[0], floats[1]


def _first(counts: IntArray, width: int) -> npt.NDArray[np.bool_]:
    """``[len(counts), width]``: True on each row's first ``counts[i]`` columns. Row i is a
    window of one ``[True] * width + [False] * width`` template, so the rows are copied, not
    compared per element (10x faster than ``arange(width) < counts[:, None]``)."""
    template = np.zeros(2 * width, dtype=bool)
    template[:width] = True
    return sliding_window_view(template, width)[width - counts]


def _valid(column: pa.ChunkedArray) -> npt.NDArray[np.bool_]:
    if column.null_count == 0:
        return np.ones(len(column), dtype=bool)
    return np.asarray(pc.is_valid(column).to_numpy(zero_copy_only=False), dtype=bool)


def _usable(samples: pa.Table, stats: BatchStats) -> pa.Table:
    """The rows a trainer can use; the others are counted in ``stats`` by reason. The table
    is filtered (its lists copied) only when a row is left out."""
    stats.samples = samples.num_rows
    adv = _valid(samples.column("advantage"))
    ids = _valid(samples.column("prompt_token_ids")) & _valid(
        samples.column("completion_token_ids")
    )
    logprobs = _valid(samples.column("completion_logprobs"))
    stats.no_advantage = int((~adv).sum())
    untokenised = adv & ~ids
    if untokenised.any():
        # A row without ids and without a recorded reason had no answered call: "missing" too.
        reasons = pc.fill_null(samples.column("token_error"), "missing")
        for entry in pc.value_counts(reasons.filter(pa.array(untokenised))).to_pylist():
            stats.token_errors[entry["values"]] = int(entry["counts"])  # per distinct reason
    stats.no_logprobs = int((adv & ids & ~logprobs).sum())
    keep = adv & ids & logprobs
    return samples if keep.all() else samples.filter(pa.array(keep))


def build_batch(
    samples: pa.Table,
    *,
    max_length: int | None = None,
    overflow: Overflow = "truncate",
    layout: Layout = "padded",
    pad_id: int = 0,
    pad_to_multiple: int = 1,
) -> Batch:
    """One batch from rows of the ``samples`` table (all the usable ones; see
    :class:`BatchStats` for what is left out and why).

    ``max_length`` bounds prompt + completion tokens per sample: ``truncate`` cuts the tail of
    the completion (its loss mask with it), ``drop`` leaves the sample out. ``padded`` pads
    every row to the longest sample (rounded up to ``pad_to_multiple``) with ``pad_id``.
    """
    stats = BatchStats()
    rows = _usable(samples, stats)
    p_off, p_vals = _lists(rows.column("prompt_token_ids"))
    c_off, c_vals = _lists(rows.column("completion_token_ids"))
    m_off, m_vals = _lists(rows.column("completion_mask"))
    l_off, l_vals = _lists(rows.column("completion_logprobs"))
    p_len, c_len = np.diff(p_off), np.diff(c_off)
    if not (np.array_equal(c_len, np.diff(m_off)) and np.array_equal(c_len, np.diff(l_off))):
        raise ValueError("completion_mask / completion_logprobs do not match the token ids")
    total = p_len + c_len
    keep = np.ones(len(total), dtype=bool)
    if max_length is not None and overflow == "drop":
        keep = total <= max_length
        stats.too_long = int((~keep).sum())
    elif max_length is not None:
        stats.truncated = int((total > max_length).sum())
    all_kept = stats.too_long == 0
    stats.used = int(keep.sum())
    n = stats.used
    lengths_all = np.minimum(total, max_length) if max_length is not None else total
    if all_kept:  # the usual batch: no per-column selection
        lengths, p_len_k, c_len_k = lengths_all, p_len, c_len
    else:
        lengths, p_len_k, c_len_k = lengths_all[keep], p_len[keep], c_len[keep]
    width = int(lengths.max()) if n else 0
    if layout == "padded" and pad_to_multiple > 1:
        width = -(-width // pad_to_multiple) * pad_to_multiple
    # Each sample's first position: its row start (padded) or its offset in the one row.
    if layout == "padded":
        shape = (n, width)
        starts = np.arange(n, dtype=np.int64) * width
    else:
        shape = (1, int(lengths.sum()))
        starts = (np.cumsum(lengths) - lengths).astype(np.int64)  # [] for no samples
    size = shape[0] * shape[1]
    input_ids, loss, attention, positions, old_lp, token_rewards = _per_position(size)
    input_ids.fill(pad_id)
    loss.fill(0)
    old_lp.fill(0)
    token_rewards.fill(0)

    def scatter(
        offsets: npt.NDArray[np.int64], lens: npt.NDArray[np.int64], base: IntArray
    ) -> tuple[IntArray, IntArray]:
        """Flat source indices of the kept rows' values and their positions in the output."""
        kept_off = offsets[:-1] if all_kept else offsets[:-1][keep]
        row = np.repeat(np.arange(n, dtype=np.int64), lens)
        within = np.arange(int(lens.sum()), dtype=np.int64) - np.repeat(
            np.cumsum(lens) - lens, lens
        )
        src = np.repeat(kept_off, lens) + within
        pos = base[row] + within
        inside = pos - starts[row] < lengths[row]  # truncation
        return src[inside], pos[inside]

    # Padded: which positions hold a token, reused for the attention mask and positions below.
    columns = np.arange(width, dtype=np.int64)
    inside = _first(lengths, width) if layout == "padded" else None
    whole = all_kept and stats.truncated == 0
    if whole and inside is not None:
        # Nothing left out or cut (the usual batch): every value lands in order, so boolean
        # masks place the flat values: a row's first p_len positions hold its prompt, the rest
        # of its tokens its completion.
        in_prompt = _first(p_len_k, width).ravel()
        in_completion = inside.ravel() ^ in_prompt
        input_ids[in_prompt] = p_vals
        input_ids[in_completion] = c_vals
        loss[in_completion] = m_vals
        old_lp[in_completion] = l_vals
    elif whole:
        # Packed, nothing cut: one pass labels each position prompt (1) or completion (2).
        segments = np.stack([p_len_k, c_len_k], axis=1).ravel()
        region = np.repeat(np.tile(np.array([1, 2], dtype=np.int8), n), segments)
        in_completion = region == 2
        input_ids[~in_completion] = p_vals
        input_ids[in_completion] = c_vals
        loss[in_completion] = m_vals
        old_lp[in_completion] = l_vals
    else:
        src, dst = scatter(p_off, p_len_k, starts)
        input_ids[dst] = p_vals[src]
        src, dst = scatter(c_off, c_len_k, starts + p_len_k)
        input_ids[dst] = c_vals[src]
        loss[dst] = m_vals[src]
        old_lp[dst] = l_vals[src]
    if "completion_rewards" in rows.column_names:
        column = rows.column("completion_rewards")
        if column.null_count < len(column):
            # Only the rows that carry rewards (a null row is all 0); lengths checked as above.
            r_off, r_vals = _lists(column)
            given = _valid(column) & (np.diff(r_off) == c_len)
            if (_valid(column) & ~given).any():
                raise ValueError("completion_rewards do not match the token ids")
            given_k = given if all_kept else given[keep]
            src, dst = scatter(r_off, np.where(given_k, c_len_k, 0), starts + p_len_k)
            token_rewards[dst] = r_vals[src]
    if inside is not None:
        np.copyto(attention.reshape(shape), inside)
        np.multiply(columns, inside, out=positions.reshape(shape))
    else:
        attention.fill(1)  # packed: no padding
        np.subtract(np.arange(size, dtype=np.int64), np.repeat(starts, lengths), out=positions)
    cut = (total > lengths_all) if max_length is not None else np.zeros(len(total), dtype=bool)
    per_sample = {
        "advantages": _column(rows, "advantage", np.nan, np.float32),
        "rewards": _column(rows, "reward", np.nan, np.float32),
        "versions": _column(rows, "policy_version", -1, np.int64),
        "trace_ids": rows.column("trace_id").to_numpy(),
        "group_ids": rows.column("episode_id").to_numpy(),
        "rollout_index": _column(rows, "rollout_index", -1, np.int64),
        "finish": rows.column("finish_reason").to_numpy(),
        "truncated": _column(rows, "truncated", False, np.bool_) | cut,
    }
    if not all_kept:
        per_sample = {name: values[keep] for name, values in per_sample.items()}
    return Batch(
        input_ids=input_ids.reshape(shape),
        attention_mask=attention.reshape(shape),
        loss_mask=loss.reshape(shape),
        inference_logprobs=old_lp.reshape(shape),
        advantages=per_sample["advantages"],
        rewards=per_sample["rewards"],
        policy_version=per_sample["versions"],
        position_ids=positions.reshape(shape),
        lengths=lengths,
        cu_seqlens=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        layout=layout,
        trace_ids=per_sample["trace_ids"],
        stats=stats,
        group_ids=per_sample["group_ids"],
        rollout_index=per_sample["rollout_index"],
        finish_reasons=per_sample["finish"],
        truncated=per_sample["truncated"],
        token_level_rewards=token_rewards.reshape(shape),
    )
