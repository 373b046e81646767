"""The episodes table: one row per task group (its n rewards, group rewards, advantages, pass@k,
and in a multi-agent episode the reward figures of each seat)."""

from __future__ import annotations

import time
from collections.abc import Iterable

import pyarrow as pa

from vfray.episode import Episode
from vfray.traces.schema import SCHEMA_VERSION_KEY, TRACE_SCHEMA_VERSION

KIND = b"episodes"
LATEST_BY = ("task_key", "created_at")
"""A task's current episode row is its latest: a resumed group writes a new row that supersedes
the old one (compaction drops the old; :func:`latest_episodes` skips it before that)."""

EPISODE_SCHEMA = pa.schema(
    [
        pa.field("schema_version", pa.int16(), nullable=False),
        pa.field("run_id", pa.string()),
        pa.field("episode_id", pa.string(), nullable=False),
        pa.field("task_key", pa.string(), nullable=False),
        pa.field("task_hash", pa.string(), nullable=False),
        pa.field("n", pa.int64(), nullable=False),
        pa.field("trace_ids", pa.list_(pa.string())),
        pa.field("rollout_indices", pa.list_(pa.int64())),
        pa.field("rewards", pa.list_(pa.float64())),
        pa.field("advantages", pa.list_(pa.float64())),
        pa.field(
            "group_rewards",
            pa.list_(
                pa.struct(
                    [pa.field("key", pa.string()), pa.field("values", pa.list_(pa.float64()))]
                )
            ),
        ),
        pa.field("mean_reward", pa.float64()),
        pa.field("pass_at_1", pa.float64()),
        pa.field("pass_at_n", pa.float64()),
        pa.field("num_ok", pa.int64()),
        pa.field("created_at", pa.float64()),
        # Multi-agent episodes: the reward figures of each seat over its own traces (the ones
        # above pool every seat); null otherwise, and in runs written before it.
        pa.field(
            "seats",
            pa.list_(
                pa.struct(
                    [
                        pa.field("seat", pa.string()),
                        pa.field("n", pa.int64()),
                        pa.field("mean_reward", pa.float64()),
                        pa.field("pass_at_1", pa.float64()),
                        pa.field("pass_at_n", pa.float64()),
                        pa.field("num_ok", pa.int64()),
                    ]
                )
            ),
        ),
    ],
    metadata={SCHEMA_VERSION_KEY: str(TRACE_SCHEMA_VERSION).encode(), b"vfray.kind": KIND},
)


def episodes_to_table(episodes: Iterable[Episode], run_id: str | None = None) -> pa.Table:
    rows = []
    for episode in episodes:
        n = len(episode.traces)
        figures = episode.seat_figures()
        rows.append(
            {
                "schema_version": TRACE_SCHEMA_VERSION,
                "run_id": run_id,
                "episode_id": episode.episode_id,
                "task_key": episode.task.key,
                "task_hash": episode.task.hash,
                "n": n,
                "trace_ids": [t.trace_id for t in episode.traces],
                "rollout_indices": [t.rollout_index for t in episode.traces],
                "rewards": episode.rewards,
                "advantages": episode.advantages,
                "group_rewards": [
                    {"key": k, "values": v} for k, v in sorted(episode.group_rewards.items())
                ],
                "mean_reward": episode.mean_reward,
                # A multi-agent episode's traces are seats x rollouts: pass@k is per seat, in
                # ``seats``; over all of them it would mix a proposer's rows with a solver's.
                "pass_at_1": episode.pass_at_k(1) if n and not figures else None,
                "pass_at_n": episode.pass_at_k(n) if n and not figures else None,
                "num_ok": sum(1 for t in episode.traces if t.ok),
                "created_at": time.time(),
                "seats": [f.model_dump() for f in figures] if figures else None,
            }
        )
    return pa.Table.from_pylist(rows, schema=EPISODE_SCHEMA)


def latest_episodes(table: pa.Table) -> pa.Table:
    """One row per task group: the latest (by ``created_at``, then row order) of each key."""
    if table.num_rows == 0:
        return table
    key, order = LATEST_BY
    best: dict[str, tuple[float, int]] = {}
    for index, (k, at) in enumerate(
        zip(table.column(key).to_pylist(), table.column(order).to_pylist(), strict=True)
    ):
        rank = (float("-inf") if at is None else at, index)
        if k not in best or rank >= best[k]:
            best[k] = rank
    if len(best) == table.num_rows:
        return table
    return table.take(sorted(i for _, i in best.values()))
