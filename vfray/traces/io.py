"""Reading and writing trace tables as Parquet: single files or directories of part files
(written, listed and compacted by :mod:`vfray.traces.parts`), conformed to the current schema.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, TypeAlias

import pyarrow as pa
import pyarrow.parquet as pq

from vfray.errors import RunFolderError
from vfray.trace import Trace
from vfray.traces.convert import traces_to_table
from vfray.traces.parts import COMPACTED_SUFFIX, unreadable_part
from vfray.traces.parts import DEFAULT_COMPRESSION as DEFAULT_COMPRESSION
from vfray.traces.parts import compact_parts as compact_parts
from vfray.traces.parts import parquet_files as parquet_files
from vfray.traces.parts import write_part as write_part
from vfray.traces.schema import KIND_KEY, SAMPLE_SCHEMA, TRACE_SCHEMA

if TYPE_CHECKING:
    import pyarrow.dataset as ds

TraceRows: TypeAlias = Iterable[Trace] | pa.Table
"""Either traces or a table already converted with :func:`traces_to_table`."""


def _as_table(rows: TraceRows) -> pa.Table:
    return rows if isinstance(rows, pa.Table) else traces_to_table(rows)


def _is_file_path(path: Path) -> bool:
    return path.suffix == ".parquet" and not path.is_dir()


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
    pq.write_table(table, target, compression=compression)
    return target


def _target_schema(schema: pa.Schema, default: pa.Schema = TRACE_SCHEMA) -> pa.Schema:
    kind = (schema.metadata or {}).get(KIND_KEY)
    if kind == b"samples":
        return SAMPLE_SCHEMA
    if kind == b"traces":
        return TRACE_SCHEMA
    return default


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
    return read_parquet(path, TRACE_SCHEMA, columns=columns)


def read_parquet(
    path: str | os.PathLike[str], schema: pa.Schema, *, columns: Sequence[str] | None = None
) -> pa.Table:
    """Read a file or a directory of parts, each part laid out as ``schema`` by :func:`conform`
    (or as the trace or samples schema when its metadata says it holds those).

    Consecutive parts with the same schema are read by one dataset scan, so a directory of
    many small parts costs one scan rather than one read per file.
    """
    if not Path(path).is_dir():
        return _read_parts(parquet_files(path), schema, columns)
    # A compaction running meanwhile can delete parts after we list them, or (directory
    # listings are not snapshots) hide both a part and the merged file holding its rows from
    # the listing: either shows as a missing file or as a merged part that was not listed.
    for attempt in range(3):
        files = parquet_files(path)
        try:
            table = _read_parts(files, schema, columns)
        except FileNotFoundError:
            if attempt == 2:
                raise
            continue
        if _compacted(parquet_files(path)) == _compacted(files) or attempt == 2:
            return table
    raise AssertionError("unreachable")


def _compacted(files: list[Path]) -> list[str]:
    return [f.name for f in files if f.name.endswith(COMPACTED_SUFFIX)]


def _read_parts(files: list[Path], default: pa.Schema, columns: Sequence[str] | None) -> pa.Table:
    if not files:
        schema = default if columns is None else pa.schema([default.field(c) for c in columns])
        return schema.empty_table()
    # Imported here: pyarrow.dataset pulls in pandas (~0.4 s), which writers (the TraceSink
    # in every run) never need.
    import pyarrow.dataset as ds
    import pyarrow.fs as pafs

    fmt = ds.ParquetFileFormat()
    local = pafs.LocalFileSystem()
    fragments = [fmt.make_fragment(str(file), local) for file in files]
    tables: list[pa.Table] = []
    # physical_schema reads each footer once; the scan reuses it.
    for available, group in _same_schema_runs(fragments):
        wanted = None if columns is None else [c for c in columns if c in available.names]
        dataset = ds.FileSystemDataset(group, available, fmt, local)
        try:
            table = dataset.to_table(columns=wanted)
        except FileNotFoundError:
            raise
        except (pa.ArrowException, OSError) as exc:
            raise _unreadable([Path(f.path) for f in group], exc) from exc
        tables.append(conform(table, _target_schema(available, default)))
    result = pa.concat_tables(tables, promote_options="default")
    if columns is not None:
        result = result.select(list(columns))
    return result


def _same_schema_runs(
    fragments: list[ds.ParquetFileFragment],
) -> Iterator[tuple[pa.Schema, list[ds.ParquetFileFragment]]]:
    """Runs of consecutive fragments whose columns and kind agree (row order is kept)."""
    run: list[ds.ParquetFileFragment] = []
    first: pa.Schema | None = None
    for fragment in fragments:
        try:
            schema = fragment.physical_schema
        except FileNotFoundError:
            raise
        except (pa.ArrowException, OSError) as exc:
            raise unreadable_part(Path(fragment.path), exc) from exc
        if first is not None and not _same_layout(first, schema):
            yield first, run
            run = []
            first = None
        if first is None:
            first = schema
        run.append(fragment)
    if first is not None:
        yield first, run


def _unreadable(files: list[Path], exc: BaseException) -> RunFolderError:
    """Name the file of ``files`` that fails to read on its own (the scan does not say)."""
    for file in files:
        try:
            pq.read_table(file)
        except (pa.ArrowException, OSError) as own:
            return unreadable_part(file, own)
    return unreadable_part(files[0].parent, exc)


def _same_layout(a: pa.Schema, b: pa.Schema) -> bool:
    kind_a = (a.metadata or {}).get(KIND_KEY)
    kind_b = (b.metadata or {}).get(KIND_KEY)
    return kind_a == kind_b and a.equals(b, check_metadata=False)


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
        """Write whatever is buffered as one part; None when nothing was buffered. Raises
        ``OSError`` when the part cannot be written, with every row still buffered."""
        if not self._buffered_rows:
            return None
        combined = pa.concat_tables(self._buffer, promote_options="default")
        # Emptied only once the part is written: a failed write (disk full) keeps the rows
        # buffered, and the next flush tries them again.
        path = self._write(combined)
        self._buffer = []
        self._buffered_rows = 0
        return path

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
