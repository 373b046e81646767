"""Results of a run, read back from its Parquet files: the final row per rollout, and the
summary (mean reward ± stderr, pass@k, scores by name, errors by type, tokens, phase times)."""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from vfray.episode import seat_role
from vfray.errors import RunFolderError
from vfray.traces.io import read_parquet, read_traces
from vfray.traces.schema import PHASES, TRACE_SCHEMA


def final_rows(table: pa.Table) -> pa.Table:
    """Keep the last attempt of each (task_key, rollout_index): earlier attempts are history.
    A multi-agent game's attempt has one row per seat; all of the last attempt's are kept."""
    if table.num_rows == 0:
        return table
    seats = "seat" in table.column_names
    columns = ["task_key", "rollout_index", *(["seat"] if seats else [])]
    # Most runs have one row per rollout (per seat): no earlier attempt to drop, and no Python
    # loop over 10,000s of rows (the viewer and `vfray show` open large runs through here).
    groups = table.group_by(columns, use_threads=False).aggregate([])
    if groups.num_rows == table.num_rows:
        return table
    keys = table.select([*columns, "attempt"]).to_pylist()
    best: dict[tuple[str, int], int] = {}
    for row in keys:
        key = (row["task_key"], row["rollout_index"])
        best[key] = max(best.get(key, row["attempt"]), row["attempt"])
    last: dict[tuple[str, int, str | None], int] = {}
    for row_index, row in enumerate(keys):
        if row["attempt"] == best[(row["task_key"], row["rollout_index"])]:
            last[(row["task_key"], row["rollout_index"], row.get("seat"))] = row_index
    return table.take(sorted(last.values()))


def _mean_stderr(values: list[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, None
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return mean, math.sqrt(var / len(values))


def _score_means(column: list[list[dict[str, Any]] | None]) -> dict[str, float | None]:
    values: dict[str, list[float]] = {}
    for pairs in column:
        for pair in pairs or []:
            bucket = values.setdefault(pair["key"], [])
            if pair["value"] is not None:
                bucket.append(pair["value"])
    return {k: (sum(v) / len(v) if v else None) for k, v in sorted(values.items())}


def _pass_at_k(episodes: pa.Table) -> dict[str, float]:
    if episodes.num_rows == 0:
        return {}
    out: dict[str, float] = {}
    p1 = [v for v in episodes.column("pass_at_1").to_pylist() if v is not None]
    pn = [v for v in episodes.column("pass_at_n").to_pylist() if v is not None]
    ns = set(episodes.column("n").to_pylist())
    if p1:
        out["pass@1"] = sum(p1) / len(p1)
    if pn and len(ns) == 1 and next(iter(ns)) > 1:
        out[f"pass@{next(iter(ns))}"] = sum(pn) / len(pn)
    # A multi-agent run: pass@k per seat, over that seat's rollouts (not seats x rollouts).
    per_seat: dict[str, tuple[list[float], list[float], set[int]]] = {}
    if "seats" in episodes.column_names:
        for figures in episodes.column("seats").to_pylist():
            for seat in figures or []:
                p1s, pns, sizes = per_seat.setdefault(seat["seat"], ([], [], set()))
                p1s.append(seat["pass_at_1"])
                pns.append(seat["pass_at_n"])
                sizes.add(seat["n"])
    for seat, (p1s, pns, sizes) in sorted(per_seat.items()):
        out[f"pass@1 (seat {seat})"] = sum(p1s) / len(p1s)
        if len(sizes) == 1 and (size := next(iter(sizes))) > 1:
            out[f"pass@{size} (seat {seat})"] = sum(pns) / len(pns)
    return out


def _ok_rewards(final: pa.Table) -> list[float]:
    return [
        reward
        for reward, ok in zip(
            final.column("reward").to_pylist(), final.column("ok").to_pylist(), strict=True
        )
        if reward is not None and ok
    ]


def _counted_rewards(final: pa.Table) -> list[float]:
    """The rewards of the rows that count in their group: not failed for infrastructure
    reasons (:func:`vfray.episode.infra_failure`, read from the error columns)."""
    from vfray.episode import INFRA_ERRORS

    out = []
    for reward, kind, phase in zip(
        final.column("reward").to_pylist(),
        final.column("error_type").to_pylist(),
        final.column("error_phase").to_pylist(),
        strict=True,
    ):
        infra = kind in INFRA_ERRORS or (kind == "PhaseTimeoutError" and phase != "agent")
        if reward is not None and not infra:
            out.append(reward)
    return out


def _untrainable_groups(episodes: pa.Table) -> int | None:
    """Groups left with fewer than 2 counted rollouts: no advantage at all. None when no group
    was meant to be compared (a ``-r 1`` run, the default eval: every group has one rollout, so
    counting them all as untrainable would say nothing)."""
    compared = untrainable = 0
    for n, indices, advantages in zip(
        episodes.column("n").to_pylist(),
        episodes.column("rollout_indices").to_pylist(),
        episodes.column("advantages").to_pylist(),
        strict=True,
    ):
        # Rollouts, not rows: a multi-agent game has a row per seat.
        if (len(set(indices)) if indices is not None else n) < 2:
            continue
        compared += 1
        if not any(a is not None for a in advantages or []):
            untrainable += 1
    return untrainable if compared else None


def summarize(traces: pa.Table, episodes: pa.Table | None = None) -> dict[str, Any]:
    """The numbers a results table shows, as a plain dict. ``reward_mean`` is over every row
    with a reward; ``reward_mean_counted`` leaves out the rollouts that failed for
    infrastructure reasons, as group means and advantages do."""
    final = final_rows(traces)
    rows = final.num_rows
    rewards = [r for r in final.column("reward").to_pylist() if r is not None] if rows else []
    mean, stderr = _mean_stderr(rewards)
    counted_mean, counted_stderr = _mean_stderr(_counted_rewards(final) if rows else [])
    errors = Counter(e for e in final.column("error_type").to_pylist() if e) if rows else {}
    phases: dict[str, float | None] = {}
    for phase in PHASES:
        col = f"{phase}_s"
        if rows and col in final.column_names:
            phases[phase] = pc.mean(final.column(col)).as_py()
    return {
        "rollouts": rows,
        "attempts": traces.num_rows,
        "ok": int(sum(1 for v in final.column("ok").to_pylist() if v)) if rows else 0,
        "reward_mean": mean,
        "reward_stderr": stderr,
        # Over the ok rollouts only: with errors, the mean above keeps what the errored ones
        # were left with, and "0 of 6 ok, reward 1" must not read as a success.
        "reward_mean_ok": _mean_stderr(_ok_rewards(final) if rows else [])[0],
        "reward_mean_counted": counted_mean,
        "reward_stderr_counted": counted_stderr,
        # Only a run with groups of 2 or more rollouts has this key.
        **(
            {"groups_untrainable": untrainable}
            if episodes is not None
            and episodes.num_rows
            and (untrainable := _untrainable_groups(episodes)) is not None
            else {}
        ),
        **(_pass_at_k(episodes) if episodes is not None else {}),
        "rewards": _score_means(final.column("rewards").to_pylist()) if rows else {},
        "metrics": _score_means(final.column("metrics").to_pylist()) if rows else {},
        "errors": dict(errors),
        "stop_conditions": dict(Counter(s for s in final.column("stop_condition").to_pylist() if s))
        if rows
        else {},
        "input_tokens": int(pc.sum(final.column("input_tokens")).as_py() or 0) if rows else 0,
        "output_tokens": int(pc.sum(final.column("output_tokens")).as_py() or 0) if rows else 0,
        "phase_seconds_mean": phases,
        # Only a multi-agent run has this key: the mean reward of each seat.
        **({"seats": seats} if (seats := _seat_means(final)) else {}),
    }


def _seat_means(final: pa.Table) -> dict[str, float | None]:
    """Mean reward per seat of a multi-agent run, a seat's runs (``solver#2``) pooled with it
    (empty for a run without seats)."""
    values: dict[str, list[float]] = {}
    if final.num_rows == 0 or "seat" not in final.column_names:
        return {}
    for seat, reward in zip(
        final.column("seat").to_pylist(), final.column("reward").to_pylist(), strict=True
    ):
        if seat is not None:
            bucket = values.setdefault(seat_role(seat) or seat, [])
            if reward is not None:
                bucket.append(reward)
    return {k: (sum(v) / len(v) if v else None) for k, v in sorted(values.items())}


class RunResult:
    """A finished (or interrupted) run's folder, with its tables read on demand."""

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.run_dir = Path(os.fspath(run_dir))

    def __repr__(self) -> str:
        return f"RunResult({str(self.run_dir)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RunResult) and other.run_dir == self.run_dir

    def __hash__(self) -> int:
        return hash(self.run_dir)

    @property
    def traces(self) -> pa.Table:
        """Every trace row (all attempts), same schema as the Parquet files. A run stopped
        before its first row has its ``config.json`` and no ``traces/`` yet (the local backend
        makes its writer on first use): that is a run with no rows, not a missing folder."""
        folder = self.run_dir / "traces"
        if not folder.exists() and (self.run_dir / "config.json").is_file():
            return TRACE_SCHEMA.empty_table()
        return read_traces(folder)

    @property
    def final_traces(self) -> pa.Table:
        return final_rows(self.traces)

    @property
    def episodes(self) -> pa.Table:
        """One row per task group (see :mod:`vfray.traces.episodes`): the current one, when a
        resumed group has written a newer row that compaction has not yet dropped the old for.
        A row whose traces are not all in ``traces/`` is left out (in a folder written before
        the sink wrote episode rows only after their traces, a full disk could take a group's
        episode row and not its trace rows, and the group counted in pass@k with no rollouts)."""
        from vfray.traces.episodes import EPISODE_SCHEMA, latest_episodes

        folder = self.run_dir / "episodes"
        if not folder.exists():
            return EPISODE_SCHEMA.empty_table()
        episodes = latest_episodes(read_parquet(folder, EPISODE_SCHEMA))
        if episodes.num_rows == 0:
            return episodes
        traces = self.run_dir / "traces"
        try:
            rows = read_traces(traces, columns=["trace_id"]) if traces.exists() else None
        except RunFolderError:
            # A corrupt traces part is reported where the traces are read (naming the file);
            # the episode rows stay readable meanwhile, unfiltered.
            return episodes
        written = set(rows.column("trace_id").to_pylist()) if rows is not None else set()
        keep = [
            all(t in written for t in ids or []) for ids in episodes.column("trace_ids").to_pylist()
        ]
        return episodes if all(keep) else episodes.filter(pa.array(keep, pa.bool_()))

    @property
    def config(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.run_dir / "config.json").read_text())
        return data

    def summary(self) -> dict[str, Any]:
        return summarize(self.traces, self.episodes)

    def to_pandas(self) -> Any:
        return self.final_traces.to_pandas()
