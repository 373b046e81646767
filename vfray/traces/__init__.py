"""vfray's trace tables: a versioned Arrow schema, Parquet reading/writing, and the per-branch
``samples`` training view, readable unchanged by pandas, HF ``datasets`` and Ray Data.

Internal: importable, but not the public API (:mod:`vfray`, :mod:`vfray.testing`,
:mod:`vfray.train`, :mod:`vfray.compat.v1`); names here may move.
"""

from vfray.traces.convert import table_to_traces, traces_to_table
from vfray.traces.io import TraceWriter, compact_parts, read_traces, write_traces
from vfray.traces.samples import to_samples
from vfray.traces.schema import (
    SAMPLE_SCHEMA,
    TRACE_SCHEMA,
    TRACE_SCHEMA_VERSION,
    schema_version,
)

__all__ = [
    "SAMPLE_SCHEMA",
    "TRACE_SCHEMA",
    "TRACE_SCHEMA_VERSION",
    "TraceWriter",
    "compact_parts",
    "read_traces",
    "schema_version",
    "table_to_traces",
    "to_samples",
    "traces_to_table",
    "write_traces",
]
