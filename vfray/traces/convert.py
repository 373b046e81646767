"""Conversion between :class:`~vfray.trace.Trace` records and Arrow tables of ``TRACE_SCHEMA``.

Columns are built column-wise (one array per column), several times faster than
``Table.from_pylist``; ``trace_json`` keeps the whole trace so the round trip is exact.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from typing import Any

import pyarrow as pa
import pydantic_core

from vfray.trace import Trace
from vfray.trace.storable import storable
from vfray.traces.columns import MessagesColumn, ScoresColumn
from vfray.traces.schema import PHASES, TRACE_SCHEMA, TRACE_SCHEMA_VERSION


def final_message_ids(trace: Trace) -> list[str]:
    """Ids of ``trace.messages`` (the branch the last call grew), without re-hashing messages."""
    if not trace.calls:
        return []
    last = trace.calls[-1].branch
    for branch in trace.branch_list:
        if branch.id == last:
            return branch.message_ids
    return []


def _typed_floats_finite(trace: Trace) -> bool:
    # A sum is finite only if every term is, so one pass over each list answers the question.
    # A false "not finite" (overflowing sum) only costs the slower, still exact, path.
    total = trace.created_at + (trace.advantage or 0.0)
    total += sum(r.value for r in trace.rewards.values() if r.value is not None)
    total += sum(r.weight for r in trace.rewards.values())
    total += sum(v for v in trace.metrics.values() if v is not None)
    for timing in [*trace.timing.values(), *trace.segments]:
        total += timing.start + (timing.end or 0.0)
    for call in trace.calls:
        total += call.started_at + call.ended_at
        if call.completion_logprobs:
            total += sum(call.completion_logprobs)
    return math.isfinite(total)


def trace_json(trace: Trace) -> str:
    """The trace as JSON that reads back to an equal trace, NaN and infinities included.

    pydantic's fast ``model_dump_json`` writes non-finite floats as ``null`` (the trace models
    do not set ``ser_json_inf_nan``), so traces holding any fall back to ``json.dumps``, which
    writes ``NaN``/``Infinity`` literals that ``model_validate_json`` accepts.
    """
    # ``reward`` and ``usage`` are computed fields: derived, ignored on validation, and already
    # columns of their own, so leaving them out saves a third of the serialization time.
    if _typed_floats_finite(trace):
        return trace.model_dump_json(exclude_computed_fields=True)
    text = json.dumps(trace.model_dump(exclude_computed_fields=True), ensure_ascii=False)
    text.encode()  # UnicodeEncodeError on a surrogate, as model_dump_json raises on one
    return text


def _storable_trace(trace: Trace) -> Trace:
    """``trace`` with its text made UTF-8 encodable (:func:`vfray.trace.storable.storable`)
    and a note saying so: a string holding a UTF-16 surrogate (a JSON escape an agent's tool
    output or transcript carried) failed the whole row, and the rollout was not written."""
    data, replaced = storable(trace.model_dump(exclude_computed_fields=True))
    fixed = Trace.model_validate(data)
    fixed.notes.append(
        f"text with UTF-16 surrogates made writable: split pairs joined, {replaced} lone "
        "one(s) written as U+FFFD"
    )
    return fixed


def _micros(seconds: float | None) -> int | None:
    return None if seconds is None else round(seconds * 1_000_000)


def _trace_row(trace: Trace) -> dict[str, Any]:
    error = trace.error()
    stop = trace.stop_condition
    starts = [t.start for t in trace.timing.values()]
    ends = [t.end for t in trace.timing.values() if t.end is not None]
    started = min(starts) if starts else None
    ended = max(ends) if ends else None
    calls = trace.calls
    versions = [c.policy_version for c in calls if c.policy_version is not None]
    row: dict[str, Any] = {
        "schema_version": TRACE_SCHEMA_VERSION,
        "run_id": trace.run_id,
        "trace_id": trace.trace_id,
        "episode_id": trace.episode_id,
        "task_key": trace.task.key,
        "task_hash": trace.task.hash,
        "task_type": trace.task.type,
        "rollout_index": trace.rollout_index,
        "attempt": trace.attempt,
        "task": pydantic_core.to_json(trace.task.data, inf_nan_mode="constants").decode(),
        "reward": trace.reward,
        "advantage": trace.advantage,
        "ok": trace.ok,
        "stop_condition": None if stop is None else stop.value,
        "terminated": None if stop is None else stop.terminated,
        "truncated": None if stop is None else stop.truncated,
        "error_type": None if error is None else error.type,
        "error_message": None if error is None else error.message,
        "error_phase": None if error is None else error.phase,
        "num_errors": len(trace.errors),
        "num_turns": trace.num_turns,
        "num_calls": len(trace.calls),
        "num_branches": len(trace.branch_list),
        # Summed here rather than through ``trace.usage``, which builds a Usage per call.
        "input_tokens": sum(c.usage.input_tokens for c in calls),
        "output_tokens": sum(c.usage.output_tokens for c in calls),
        "model": trace.agent.model,
        "harness": trace.agent.harness,
        "runtime": trace.agent.runtime,
        "created_at": _micros(trace.created_at),
        "started_at": _micros(started),
        "ended_at": _micros(ended),
        "duration_s": None if started is None or ended is None else max(0.0, ended - started),
        "policy_version": min(versions) if versions else None,
        "seat": trace.seat,
        "agent_name": trace.agent.name,
        "turn_rewards": [trace.turn_rewards.get(c.index) for c in calls]
        if trace.turn_rewards
        else None,
        "trace_json": trace_json(trace),
    }
    for phase in PHASES:
        timing = trace.timing.get(phase)
        row[f"{phase}_s"] = None if timing is None else timing.duration
    return row


def _column(field: pa.Field, values: list[Any]) -> pa.Array:
    if pa.types.is_timestamp(field.type):
        # Epoch microseconds as int64, then a zero-copy cast: no datetime objects are built.
        return pa.array(values, type=pa.int64()).cast(field.type)
    return pa.array(values, type=field.type)


def traces_to_table(traces: Iterable[Trace]) -> pa.Table:
    """Convert traces to one Arrow table of ``TRACE_SCHEMA`` (one row per trace)."""
    rows: list[dict[str, Any]] = []
    messages, rewards, metrics = MessagesColumn(), ScoresColumn(), ScoresColumn()
    for trace in traces:
        try:
            row = _trace_row(trace)
        except (UnicodeEncodeError, pydantic_core.PydanticSerializationError):
            trace = _storable_trace(trace)
            row = _trace_row(trace)
        rows.append(row)
        messages.append(trace, final_message_ids(trace))
        rewards.append((name, r.value) for name, r in trace.rewards.items())
        metrics.append(trace.metrics.items())
    nested: dict[str, MessagesColumn | ScoresColumn] = {
        "messages": messages,
        "rewards": rewards,
        "metrics": metrics,
    }
    columns = [
        nested[field.name].finish()
        if field.name in nested
        else _column(field, [row[field.name] for row in rows])
        for field in TRACE_SCHEMA
    ]
    return pa.Table.from_arrays(columns, schema=TRACE_SCHEMA)


def table_to_traces(table: pa.Table) -> list[Trace]:
    """Rebuild the exact traces of a trace table from its lossless ``trace_json`` column."""
    if "trace_json" not in table.column_names:
        raise ValueError(
            "table has no 'trace_json' column, so traces cannot be rebuilt; "
            "read the table without a column projection (or include 'trace_json')"
        )
    return [
        Trace.model_validate_json(text)
        for text in table.column("trace_json").to_pylist()
        if text is not None
    ]
