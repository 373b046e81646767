"""Directories of Parquet part files: the ``part-NNNNN.parquet`` names, listing them in order,
linking a finished file in under the next free name, and compacting them into one part.

A file is written under a hidden temporary name and hard-linked to its final name, so readers
never see a half-written part and no part is ever overwritten, even with several writers in one
directory. :func:`compact_parts` merges the parts into one ``part-NNNNN-compacted.parquet`` whose
metadata names the parts it replaces, so a reader that finds both skips the replaced ones.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from vfray.errors import RunFolderError

_PART = re.compile(r"^part-(\d+)(-compacted)?\.parquet$")
_COMPACT_TMP = ".compact-"
COMPACTED_SUFFIX = "-compacted.parquet"
DEFAULT_COMPRESSION = "zstd"
REPLACES_KEY = b"vfray.replaces"
"""Metadata key of a compacted part: the JSON list of the part names whose rows it holds."""
ROW_GROUP_BYTES = 64 * 1024 * 1024
"""Compaction's row-group size, in bytes of Arrow data: large enough to compress well and to
read fast, small enough that compacting holds only about this much in memory."""


def write_part(
    table: pa.Table, directory: str | os.PathLike[str], *, compression: str = DEFAULT_COMPRESSION
) -> Path:
    """Write ``table`` as the next ``part-NNNNN.parquet`` in ``directory``; never overwrites."""
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    # Readers (pyarrow, datasets, Ray) skip names starting with "." so the temp file is invisible.
    tmp = folder / f".tmp-{uuid.uuid4().hex}.parquet"
    try:
        pq.write_table(table, tmp, compression=compression)
        return _link_next(tmp, folder)
    finally:
        # Also after a failed write (disk full): no half-written file is left behind.
        tmp.unlink(missing_ok=True)


def _link_next(tmp: Path, folder: Path, *, compacted: bool = False) -> Path:
    """Link ``tmp`` in as the next free part number."""
    index = _next_index(folder)
    while True:
        final = folder / f"part-{index:05d}{COMPACTED_SUFFIX if compacted else '.parquet'}"
        try:
            os.link(tmp, final)  # atomic and fails if the name exists: no overwrite race
            return final
        except FileExistsError:
            index += 1


def _next_index(folder: Path) -> int:
    indices = [int(m.group(1)) for p in folder.iterdir() if (m := _PART.match(p.name))]
    return max(indices, default=-1) + 1


def parquet_files(path: str | os.PathLike[str]) -> list[Path]:
    """The Parquet files that make up ``path``: itself, or a directory's visible parts in order.

    Parts that a compacted part in the directory replaces are left out: they are the leftovers
    of a compaction that stopped before deleting them, and their rows are in the compacted part.
    """
    target = Path(path)
    if target.is_file():
        return [target]
    if not target.is_dir():
        raise FileNotFoundError(f"no trace file or directory at {target}")
    files = _visible_parts(target)
    replaced = {name for file in files for name in _replaced_by(file)}
    return [file for file in files if file.name not in replaced]


def _visible_parts(folder: Path) -> list[Path]:
    # Readers (pyarrow, datasets, Ray) skip names starting with "." or "_"; so do we.
    return sorted(
        (
            p
            for p in folder.iterdir()
            if p.suffix == ".parquet" and not p.name.startswith((".", "_")) and p.is_file()
        ),
        key=_order,
    )


def _order(path: Path) -> str:
    # Numeric order of parts, also past part-99999 where names stop sorting as numbers do.
    m = _PART.match(path.name)
    return f"part-{int(m.group(1)):020d}{m.group(2) or ''}" if m else path.name


def _replaced_by(file: Path) -> list[str]:
    """The parts a compacted part holds the rows of (none for an ordinary part)."""
    m = _PART.match(file.name)
    if m is None or not m.group(2):
        return []
    try:
        raw = (pq.read_schema(file).metadata or {}).get(REPLACES_KEY)
    except FileNotFoundError:
        raise
    except (pa.ArrowException, OSError) as exc:
        raise unreadable_part(file, exc) from exc
    names: list[str] = json.loads(raw) if raw else []
    # A compacted part only ever replaces parts numbered before it.
    index = int(m.group(1))
    return [n for n in names if (r := _PART.match(n)) is not None and int(r.group(1)) < index]


def unreadable_part(path: Path, exc: BaseException) -> RunFolderError:
    """The one error a corrupt or truncated Parquet file is reported as."""
    reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return RunFolderError(
        f"cannot read {path}: {reason} (a truncated or corrupt Parquet file; move it out of "
        "the folder to read the rest, and `vfray resume` reruns its rollouts)"
    )


def compact_parts(
    directory: str | os.PathLike[str],
    *,
    compression: str = DEFAULT_COMPRESSION,
    row_group_bytes: int = ROW_GROUP_BYTES,
    latest_by: tuple[str, str] | None = None,
) -> Path | None:
    """Merge a directory's parts into one ``part-NNNNN-compacted.parquet``, in row order.

    ``latest_by=(key, order)`` keeps only the row with the largest ``order`` of each ``key``
    (the later row on a tie): the episodes table, where a resumed group's new row supersedes
    its old one, so that readers of the compacted folder see one row per group.

    Returns the new part, or None when there was nothing to merge (no directory, or at most
    one part). Rows are streamed row group by row group, so memory stays near
    ``row_group_bytes`` whatever the size of the run. Parts of different schemas are merged
    into the union of their columns (types widened, missing columns null).

    No row is lost or doubled if the process dies at any point: the merged file is written
    under a hidden name, fsynced, linked in under its final name, and only then are the old
    parts deleted. Until they are, :func:`parquet_files` skips them (the merged part names
    them in its metadata), and the next compaction deletes them first. Writers may append
    parts meanwhile (those are kept); two compactions of one directory take turns on a lock.
    Readers other than vfray's (pandas, ``datasets``) see the rows twice only inside that
    short window, or after a crash inside it until the next compaction.
    """
    folder = Path(directory)
    if not folder.is_dir():
        return None
    with _locked(folder) as dir_fd:
        _finish_earlier(folder, dir_fd)
        # Only part-NNNNN files: a replaced name must never come back as a new file.
        parts = [p for p in _visible_parts(folder) if _PART.match(p.name)]
        if len(parts) < 2:
            return None
        schema = _merged_schema(parts)
        keep = _latest_rows(parts, *latest_by) if latest_by is not None else None
        tmp = folder / f"{_COMPACT_TMP}{uuid.uuid4().hex}.parquet"
        try:
            _write_merged(parts, schema, tmp, compression, row_group_bytes, keep)
            final = _link_next(tmp, folder, compacted=True)
            os.fsync(dir_fd)
            for part in parts:
                part.unlink(missing_ok=True)
            os.fsync(dir_fd)
        finally:
            tmp.unlink(missing_ok=True)
        return final


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[int]:
    """An exclusive lock on the directory itself (no lock file to leave behind)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield fd
    finally:
        os.close(fd)  # closing releases the lock


def _finish_earlier(folder: Path, dir_fd: int) -> None:
    """Complete a compaction that died: delete the parts a compacted part already holds, and
    its orphaned temporary file (no other compaction runs: we hold the lock)."""
    files = _visible_parts(folder)
    replaced = {name for file in files for name in _replaced_by(file)}
    stale = [file for file in files if file.name in replaced]
    stale += [p for p in folder.iterdir() if p.name.startswith(_COMPACT_TMP)]
    for file in stale:
        file.unlink(missing_ok=True)
    if stale:
        os.fsync(dir_fd)


def _merged_schema(parts: list[Path]) -> pa.Schema:
    schemas = [pq.read_schema(part) for part in parts]
    try:
        merged = pa.unify_schemas(schemas, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise TypeError(f"cannot compact {parts[0].parent}: parts disagree: {exc}") from exc
    # Nullable if any part has it nullable, or lacks it (its rows are then null there).
    fields = [f.with_nullable(any(_nullable_in(s, f.name) for s in schemas)) for f in merged]
    metadata = dict(schemas[-1].metadata or {})
    metadata[REPLACES_KEY] = json.dumps([part.name for part in parts]).encode()
    return pa.schema(fields, metadata=metadata)


def _nullable_in(schema: pa.Schema, name: str) -> bool:
    index = schema.get_field_index(name)
    return index < 0 or bool(schema.field(index).nullable)


def finish_compaction(directory: str | os.PathLike[str]) -> None:
    """Clean up after a compaction that died (replaced parts, its temporary file), if any."""
    folder = Path(directory)
    if folder.is_dir():
        with _locked(folder) as dir_fd:
            _finish_earlier(folder, dir_fd)


def _latest_rows(parts: list[Path], key: str, order: str) -> list[list[bool]]:
    """Per part, per row: whether it is the latest row of its ``key`` (rows of parts that
    lack the columns are all kept)."""
    best: dict[object, tuple[float, int, int]] = {}
    sizes: list[int] = []
    for p_index, part in enumerate(parts):
        names = pq.read_schema(part).names
        if key not in names or order not in names:
            sizes.append(-1)
            continue
        columns = pq.read_table(part, columns=[key, order]).to_pydict()
        sizes.append(len(columns[key]))
        for r_index, (k, o) in enumerate(zip(columns[key], columns[order], strict=True)):
            rank = (float("-inf") if o is None else float(o), p_index, r_index)
            if k not in best or rank >= best[k]:
                best[k] = rank
    winners = {(p, r) for _, p, r in best.values()}
    keep: list[list[bool]] = []
    for p_index, (part, size) in enumerate(zip(parts, sizes, strict=True)):
        if size < 0:
            keep.append([True] * pq.ParquetFile(part).metadata.num_rows)
        else:
            keep.append([(p_index, r) in winners for r in range(size)])
    return keep


def _write_merged(
    parts: list[Path],
    schema: pa.Schema,
    path: Path,
    compression: str,
    row_group_bytes: int,
    keep: list[list[bool]] | None = None,
) -> None:
    buffer: list[pa.Table] = []
    size = 0
    with pq.ParquetWriter(path, schema, compression=compression) as writer:

        def flush() -> None:
            table = pa.concat_tables(buffer)
            # One call, one row group.
            writer.write_table(table, row_group_size=max(table.num_rows, 1))
            buffer.clear()

        for p_index, part in enumerate(parts):
            offset = 0
            with pq.ParquetFile(part) as source:
                for index in range(source.num_row_groups):
                    table = _widen(source.read_row_group(index), schema)
                    if keep is not None:
                        mask = keep[p_index][offset : offset + table.num_rows]
                        offset += table.num_rows
                        table = table.filter(pa.array(mask, pa.bool_()))
                    buffer.append(table)
                    size += table.nbytes
                    if size >= row_group_bytes:
                        flush()
                        size = 0
        if buffer:
            flush()
    with path.open("rb") as written:
        os.fsync(written.fileno())


def _widen(table: pa.Table, schema: pa.Schema) -> pa.Table:
    arrays = [
        table.column(f.name).cast(f.type)
        if f.name in table.column_names
        else pa.chunked_array([pa.nulls(table.num_rows, f.type)])
        for f in schema
    ]
    return pa.Table.from_arrays(arrays, schema=schema)
