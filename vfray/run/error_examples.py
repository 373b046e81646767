"""The first failed rollout of each way of failing (error type, phase, message) in a run's final
rows, and how many failed that way: what the results table, ``vfray show`` and the viewer's
summary name as a run's errors."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["ErrorExample", "first_errors"]


@dataclass(frozen=True)
class ErrorExample:
    """The first rollout (in run order) that failed one way (error type, phase and message),
    and how many did."""

    type: str
    count: int
    message: str
    phase: str | None
    task_key: str
    rollout_index: int


MAX_GROUPS = 10
"""Error groups shown one by one; rarer ones are folded into one line per type and phase."""
_VARYING = re.compile(r"0x[0-9a-fA-F]+|[0-9a-f]{8,}|\d+")
"""Parts of a message that differ between rollouts failing the same way (ids, counts, ports)."""


def _shape(message: str | None) -> str:
    return _VARYING.sub("#", " ".join((message or "").split()))


def first_errors(final: pa.Table) -> list[ErrorExample]:
    """One example per way of failing among the final rows: error type, phase and message
    (numbers and hex ids aside, so "task 3 failed" and "task 7 failed" are one way), most
    frequent first. Grouping by type alone hid, under "TaskError x5 in setup", 3 finalize
    errors with another message. Past :data:`MAX_GROUPS`, the rarer groups of one type and
    phase are folded into one, its message saying how many kinds it holds."""
    if final.num_rows == 0:
        return []
    columns = ["error_type", "error_message", "error_phase", "task_key", "rollout_index"]
    counts: dict[tuple[str, str, str], int] = {}
    first: dict[tuple[str, str, str], dict[str, Any]] = {}
    for row in final.select(columns).to_pylist():
        kind = row["error_type"]
        if kind:
            key = (kind, row["error_phase"] or "", _shape(row["error_message"]))
            counts[key] = counts.get(key, 0) + 1
            first.setdefault(key, row)
    order = sorted(counts, key=lambda k: (-counts[k], k))
    shown, rest = order[:MAX_GROUPS], order[MAX_GROUPS:]
    examples = [_example(first[k], counts[k]) for k in shown]
    folded: dict[tuple[str, str], list[tuple[str, str, str]]] = {}
    for key in rest:
        folded.setdefault(key[:2], []).append(key)
    for keys in folded.values():
        row = first[keys[0]]
        note = f"({len(keys)} kinds of message; the first:) " if len(keys) > 1 else ""
        examples.append(_example(row, sum(counts[k] for k in keys), note))
    return examples


def _example(row: dict[str, Any], count: int, prefix: str = "") -> ErrorExample:
    message = " ".join((row["error_message"] or "").split())[:300] or "(no message)"
    return ErrorExample(
        row["error_type"],
        count,
        prefix + message,
        row["error_phase"],
        row["task_key"],
        row["rollout_index"],
    )
