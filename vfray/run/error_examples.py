"""The first failed rollout of each error type in a run's final rows, and how many failed that
way: what the results table, ``vfray show`` and the viewer's summary name as a run's errors."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["ErrorExample", "first_errors"]


@dataclass(frozen=True)
class ErrorExample:
    """The first rollout (in run order) that failed with one error type, and how many did."""

    type: str
    count: int
    message: str
    phase: str | None
    task_key: str
    rollout_index: int


def first_errors(final: pa.Table) -> list[ErrorExample]:
    """One example per error type among the final rows, most frequent type first."""
    if final.num_rows == 0:
        return []
    columns = ["error_type", "error_message", "error_phase", "task_key", "rollout_index"]
    counts: dict[str, int] = {}
    first: dict[str, dict[str, Any]] = {}
    for row in final.select(columns).to_pylist():
        kind = row["error_type"]
        if kind:
            counts[kind] = counts.get(kind, 0) + 1
            first.setdefault(kind, row)
    return [
        ErrorExample(
            kind,
            counts[kind],
            " ".join((first[kind]["error_message"] or "").split())[:300] or "(no message)",
            first[kind]["error_phase"],
            first[kind]["task_key"],
            first[kind]["rollout_index"],
        )
        for kind in sorted(counts, key=lambda k: (-counts[k], k))
    ]
