"""Reading and writing trace tables as Parquet: single files or directories of part files.

Part files are written under a hidden temporary name and then hard-linked to their final
``part-NNNNN.parquet`` name, so readers never see a half-written part and no part is ever
overwritten, even with several writers in one directory.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import TypeAlias

import pyarrow as pa
import pyarrow.parquet as pq

from vfray.trace import Trace
from vfray.traces.convert import traces_to_table
from vfray.traces.schema import KIND_KEY, SAMPLE_SCHEMA, TRACE_SCHEMA

_PART = re.compile(r"^part-(\d+)\.parquet$")
DEFAULT_COMPRESSION = "zstd"

TraceRows: TypeAlias = Iterable[Trace] | pa.Table
"""Either traces or a table already converted with :func:`traces_to_table`."""


def _as_table(rows: TraceRows) -> pa.Table:
    return rows if isinstance(rows, pa.Table) else traces_to_table(rows)


def _is_file_path(path: Path) -> bool:
    return path.suffix == ".parquet" and not path.is_dir()


def _write_file(table: pa.Table, path: Path, compression: str) -> None:
    pq.write_table(table, path, compression=compression)


def write_part(
    table: pa.Table, directory: str | os.PathLike[str], *, compression: str = DEFAULT_COMPRESSION
) -> Path:
    """Write ``table`` as the next ``part-NNNNN.parquet`` in ``directory``; never overwrites."""
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    # Readers (pyarrow, datasets, Ray) skip names starting with "." so the temp file is invisible.
    tmp = folder / f".tmp-{uuid.uuid4().hex}.parquet"
    _write_file(table, tmp, compression)
    try:
        index = _next_index(folder)
        while True:
            final = folder / f"part-{index:05d}.parquet"
            try:
                os.link(tmp, final)  # atomic and fails if the name exists: no overwrite race
                return final
            except FileExistsError:
                index += 1
    finally:
        tmp.unlink(missing_ok=True)


def _next_index(folder: Path) -> int:
    indices = [int(m.group(1)) for p in folder.iterdir() if (m := _PART.match(p.name))]
    return max(indices, default=-1) + 1


def write_traces(
    traces: TraceRows,
    path: str | os.PathLike[str],
    *,
    overwrite: bool = False,
    compression: str = DEFAULT_COMPRESSION,
) -> Path:
    """Write traces to Parquet and return the file written.

    ``path`` ending in ``.parquet`` is a single file (an existing one is an error unless
    ``overwrite``); any other path is a directory that gets a new part file.
    """
    table = _as_table(traces)
    target = Path(path)
    if not _is_file_path(target):
        return write_part(table, target, compression=compression)
    if target.exists() and not overwrite:
        raise FileExistsError(f"{target} exists; pass overwrite=True or write to a directory")
    target.parent.mkdir(parents=True, exist_ok=True)
    _write_file(table, target, compression)
    return target


def parquet_files(path: str | os.PathLike[str]) -> list[Path]:
    """The Parquet files that make up ``path``: itself, or a directory's visible parts in order."""
    target = Path(path)
    if target.is_file():
        return [target]
    if not target.is_dir():
        raise FileNotFoundError(f"no trace file or directory at {target}")
    return sorted(
        p
        for p in target.iterdir()
        if p.suffix == ".parquet" and not p.name.startswith((".", "_")) and p.is_file()
    )


def _target_schema(schema: pa.Schema) -> pa.Schema:
    kind = (schema.metadata or {}).get(KIND_KEY)
    return SAMPLE_SCHEMA if kind == b"samples" else TRACE_SCHEMA


def conform(table: pa.Table, target: pa.Schema) -> pa.Table:
    """Lay ``table`` out as ``target``: missing columns become nulls, older types are cast.

    Columns unknown to ``target`` (written by a newer vfray) are kept after the known ones.
    """
    arrays: list[pa.ChunkedArray] = []
    fields: list[pa.Field] = []
    for field in target:
        if field.name in table.column_names:
            column = table.column(field.name)
            if column.type != field.type:
                try:
                    column = column.cast(field.type)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                    raise TypeError(
                        f"trace column {field.name!r} has type {column.type}, "
                        f"which cannot be read as {field.type}"
                    ) from exc
            arrays.append(column)
            fields.append(field.with_nullable(field.nullable or column.null_count > 0))
        else:
            arrays.append(pa.chunked_array([pa.nulls(table.num_rows, field.type)]))
            fields.append(field.with_nullable(True))
    for field in table.schema:
        if target.get_field_index(field.name) < 0:
            arrays.append(table.column(field.name))
            fields.append(field)
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields, metadata=target.metadata))


def read_traces(path: str | os.PathLike[str], *, columns: Sequence[str] | None = None) -> pa.Table:
    """Read a trace file or a directory of part files into one table of the current schema.

    Files written by older schema versions are filled with nulls for the columns they lack
    (their own version stays visible in the ``schema_version`` column). ``columns`` projects.
    """
    files = parquet_files(path)
    if not files:
        target = TRACE_SCHEMA
        schema = target if columns is None else pa.schema([target.field(c) for c in columns])
        return schema.empty_table()
    tables: list[pa.Table] = []
    for file in files:
        available = pq.read_schema(file)
        wanted = None if columns is None else [c for c in columns if c in available.names]
        table = pq.read_table(file, columns=wanted)
        tables.append(conform(table, _target_schema(available)))
    result = pa.concat_tables(tables, promote_options="default")
    if columns is not None:
        result = result.select(list(columns))
    return result


class TraceWriter:
    """Appends traces to a directory as Parquet part files, one part per ``flush_rows`` rows.

    Rows are buffered as Arrow tables and written when the buffer reaches ``flush_rows``, on
    :meth:`flush`, and on :meth:`close` (or leaving the ``with`` block).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        flush_rows: int = 10_000,
        compression: str = DEFAULT_COMPRESSION,
    ) -> None:
        if flush_rows < 1:
            raise ValueError(f"flush_rows must be at least 1, got {flush_rows}")
        self.directory = Path(directory)
        self.flush_rows = flush_rows
        self.compression = compression
        self.parts: list[Path] = []
        self.rows_written = 0
        self._buffer: list[pa.Table] = []
        self._buffered_rows = 0
        self._closed = False
        self.directory.mkdir(parents=True, exist_ok=True)

    @property
    def buffered_rows(self) -> int:
        return self._buffered_rows

    def write(self, rows: TraceRows) -> list[Path]:
        """Buffer traces (or a trace table); returns the part files this call flushed."""
        if self._closed:
            raise ValueError("TraceWriter is closed")
        table = _as_table(rows)
        if table.num_rows == 0:
            return []
        self._buffer.append(table)
        self._buffered_rows += table.num_rows
        written: list[Path] = []
        while self._buffered_rows >= self.flush_rows:
            combined = pa.concat_tables(self._buffer, promote_options="default")
            head = combined.slice(0, self.flush_rows)
            rest = combined.slice(self.flush_rows)
            written.append(self._write(head))
            self._buffer = [rest] if rest.num_rows else []
            self._buffered_rows = rest.num_rows
        return written

    def flush(self) -> Path | None:
        """Write whatever is buffered as one part; None when nothing was buffered."""
        if not self._buffered_rows:
            return None
        combined = pa.concat_tables(self._buffer, promote_options="default")
        self._buffer = []
        self._buffered_rows = 0
        return self._write(combined)

    def _write(self, table: pa.Table) -> Path:
        path = write_part(table, self.directory, compression=self.compression)
        self.parts.append(path)
        self.rows_written += table.num_rows
        return path

    def close(self) -> None:
        if not self._closed:
            self.flush()
            self._closed = True

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
