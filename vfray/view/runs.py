"""A run folder as the viewer reads it: the light columns of every trace part (no transcripts),
read once per part file and re-read only when the folder's listing changes, so a run that is
still being written is followed and a 10,000-rollout run opens in about a second.

Nothing here writes: parts are opened read-only, and problems (no ``config.json``, a corrupt
part, an older or newer schema) become notes shown on the page rather than exceptions.
"""

from __future__ import annotations

import functools
import json
import os
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from vfray.errors import RunFolderError
from vfray.run.results import final_rows
from vfray.traces.episodes import EPISODE_SCHEMA, latest_episodes
from vfray.traces.io import conform, read_parquet
from vfray.traces.parts import parquet_files
from vfray.traces.schema import SCHEMA_VERSION_KEY, TRACE_SCHEMA, TRACE_SCHEMA_VERSION

HEAVY = frozenset({"trace_json", "messages", "task"})
"""Columns left out of the list view: transcripts, read per rollout or per search only."""
LIGHT_SCHEMA = pa.schema([f for f in TRACE_SCHEMA if f.name not in HEAVY])
KNOWN = frozenset(TRACE_SCHEMA.names)
GROUPS_KEPT = 2
"""Decoded ``trace_json`` row groups kept: a group's rollouts (an episode page) usually share
one, and a compacted row group holds up to 64 MiB of text."""
POSITION = ("_part", "_row")
"""Columns the viewer adds: which part file a row came from, and its row in that file."""
PROMPT = re.compile(
    r'"prompt":\s*"(?P<text>(?:[^"\\]|\\.){0,200})'
    r'|"role":\s*"user",\s*"content":\s*"(?P<chat>(?:[^"\\]|\\.){0,200})'
)
"""The start of the prompt in a row's ``task`` JSON (a string prompt, else the first user
message of a chat prompt), taken by an Arrow kernel without decoding the task's data."""
PROMPT_SCAN = 4096
"""Characters of the task JSON searched for it (the prompt is its first field)."""


def _scalar(kind: pa.DataType) -> bool:
    nested = pa.types.is_nested(kind) or pa.types.is_large_string(kind)
    return not nested and not pa.types.is_large_binary(kind) and not pa.types.is_binary(kind)


@dataclass(frozen=True)
class Part:
    """One part file's light rows, with what the reader noticed about it."""

    table: pa.Table
    version: int | None


@dataclass
class Snapshot:
    """A run folder at one moment: its rows and everything the pages need to know about it."""

    path: Path
    stamp: str
    problem: str | None = None
    """Why there is nothing to show (not a run folder, an empty one); None when there is."""
    notes: list[str] = field(default_factory=list)
    config: dict[str, Any] | None = None
    parts: list[Path] = field(default_factory=list)
    rows: pa.Table = field(default_factory=lambda: _empty())
    episodes: pa.Table = field(default_factory=EPISODE_SCHEMA.empty_table)
    extra_columns: list[str] = field(default_factory=list)
    """Scalar columns this vfray does not know (a newer writer's): shown as they are."""

    pages: dict[str, str] = field(default_factory=dict)
    """Pages that depend on the snapshot only (the summary), built once per snapshot."""

    @functools.cached_property
    def final(self) -> pa.Table:
        return final_rows(self.rows)

    @property
    def title(self) -> str:
        """The run as people tell runs apart: model and harness, then the run id."""
        header = self.config or {}
        run_id = str(header.get("run_id") or self.path.name)
        config = header.get("config")
        if not isinstance(config, dict):
            return run_id
        model = (config.get("model") or {}).get("name")
        harness = ((config.get("env") or {}).get("harness") or {}).get("id")
        return " · ".join(str(p) for p in (model, harness, run_id) if p)

    def prompts(self) -> dict[str, str]:
        """Task key -> the start of its prompt (for tasks shown by their hash key)."""
        if not len(self.rows) or "_prompt" not in self.rows.column_names:
            return {}
        columns = self.rows.select(["task_key", "_prompt"]).to_pydict()
        return {k: p for k, p in zip(columns["task_key"], columns["_prompt"], strict=True) if p}


FIND_DEPTH = 3
"""How deep :func:`expand_runs` looks: ``outputs/<taskset--model--harness>/<run id>`` is 2."""


def is_run_folder(path: Path) -> bool:
    return (path / "config.json").is_file() or (path / "traces").is_dir()


def expand_runs(path: Path) -> list[Path]:
    """``path`` itself when it is a run folder (or holds no run folder: its page says why),
    else the run folders under it, newest first: ``vfray view outputs/`` lists every run."""
    if is_run_folder(path):
        return [path]
    found: list[Path] = []
    level = [path]
    for _ in range(FIND_DEPTH):
        below: list[Path] = []
        for folder in level:
            try:
                children = sorted(p for p in folder.iterdir() if p.is_dir())
            except OSError:
                continue
            for child in children:
                if child.name.startswith("."):
                    continue
                (found if is_run_folder(child) else below).append(child)
        level = below
    if not found:
        return [path]
    return sorted(found, key=lambda p: (p / "config.json").stat().st_mtime
                  if (p / "config.json").exists() else 0.0, reverse=True)  # fmt: skip


def _empty() -> pa.Table:
    table = LIGHT_SCHEMA.empty_table().append_column("_prompt", pa.array([], pa.string()))
    for name in POSITION:
        table = table.append_column(name, pa.array([], pa.int64()))
    return table


def _prompts(task: pa.ChunkedArray) -> pa.Array:
    """Each row's prompt start (None when its task JSON has none), for hash-keyed tasks."""
    head = pc.utf8_slice_codeunits(task.combine_chunks(), 0, PROMPT_SCAN)
    found = pc.extract_regex(head, PROMPT.pattern)
    out: list[str | None] = []
    for pair in found.to_pylist():
        raw = (pair["text"] or pair["chat"]) if pair else None
        out.append(_unescape(raw) if raw else None)
    return pa.array(out, pa.string())


def _unescape(raw: str) -> str:
    """A JSON string body cut at any point: decoded, with a cut escape dropped."""
    for end in range(len(raw), max(len(raw) - 6, -1), -1):
        try:
            text: str = json.loads(f'"{raw[:end]}"')
            return text
        except ValueError:
            continue
    return raw


def _stamp(path: Path) -> str:
    """What changes whenever the run writes, compacts or finishes: names, sizes, mtimes."""
    entries: list[str] = []
    for sub in ("", "traces", "episodes"):
        folder = path / sub if sub else path
        try:
            with os.scandir(folder) as it:
                for entry in it:
                    if entry.name.startswith(".") or not entry.is_file():
                        continue
                    info = entry.stat()
                    entries.append(f"{sub}/{entry.name}:{info.st_size}:{info.st_mtime_ns}")
        except OSError:
            entries.append(f"{sub}/-")
    return str(hash(tuple(sorted(entries))) & 0xFFFFFFFFFFFF)


class RunFolder:
    """One run folder given to ``vfray view``; :meth:`snapshot` is cheap when nothing changed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._parts: dict[tuple[str, int, int], Part] = {}
        self._texts: dict[tuple[str, int, int], pa.Array] = {}
        self._groups: OrderedDict[tuple[str, int], pa.ChunkedArray] = OrderedDict()
        self._snapshot: Snapshot | None = None

    def snapshot(self) -> Snapshot:
        stamp = _stamp(self.path)
        with self._lock:
            if self._snapshot is None or self._snapshot.stamp != stamp:
                self._snapshot = self._read(stamp)
            return self._snapshot

    def _read(self, stamp: str) -> Snapshot:
        snap = Snapshot(self.path, stamp)
        path = self.path
        if not path.is_dir():
            snap.problem = f"{path} does not exist (or is not a folder)."
            return snap
        traces, config = path / "traces", path / "config.json"
        if not traces.is_dir() and not config.exists():
            listing = sorted(p.name for p in path.iterdir() if not p.name.startswith("."))
            snap.problem = (
                f"{path} is empty: no run has written here yet."
                if not listing
                else f"{path} is not a vfray run folder: it has no config.json and no traces/ "
                f"(it holds {', '.join(listing[:8])}{', …' if len(listing) > 8 else ''})."
            )
            return snap
        if config.exists():
            try:
                snap.config = json.loads(config.read_text())
            except (OSError, ValueError) as exc:
                snap.notes.append(f"config.json cannot be read ({exc}); showing the traces only.")
        else:
            snap.notes.append(
                "No config.json: the run is starting, or this folder was half-written."
            )
        if traces.is_dir():
            self._read_traces(snap, traces)
        else:
            snap.notes.append("No traces/ folder yet: no rollout has finished.")
        if (path / "episodes").is_dir():
            try:
                snap.episodes = latest_episodes(read_parquet(path / "episodes", EPISODE_SCHEMA))
            except (RunFolderError, OSError, pa.ArrowException, TypeError) as exc:
                snap.notes.append(f"The episodes table cannot be read: {exc}")
        return snap

    def _read_traces(self, snap: Snapshot, traces: Path) -> None:
        try:
            files = parquet_files(traces)
        except (RunFolderError, OSError) as exc:
            snap.notes.append(f"The traces folder cannot be listed: {exc}")
            return
        tables: list[pa.Table] = []
        versions: set[int | None] = set()
        live: set[tuple[str, int, int]] = set()
        for file in files:
            try:
                info = file.stat()
                key = (str(file), info.st_size, info.st_mtime_ns)
                part = self._parts.get(key) or _read_part(file)
            except (OSError, pa.ArrowException, TypeError) as exc:
                reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                snap.notes.append(
                    f"{file.name} cannot be read and is left out ({reason}): a truncated or "
                    "corrupt part, or one still being written by an older vfray."
                )
                continue
            self._parts[key] = part
            live.add(key)
            versions.add(part.version)
            index = len(snap.parts)
            snap.parts.append(file)
            n = part.table.num_rows
            table = part.table.append_column("_part", pa.array([index] * n, pa.int64()))
            tables.append(table.append_column("_row", pa.array(range(n), pa.int64())))
        # Parts replaced by a compaction are gone from the listing: forget them.
        self._parts = {k: v for k, v in self._parts.items() if k in live}
        self._texts = {k: v for k, v in self._texts.items() if k in live}
        if tables:
            snap.rows = pa.concat_tables(tables, promote_options="default")
        snap.extra_columns = [
            n for n in snap.rows.column_names if n not in KNOWN and n not in (*POSITION, "_prompt")
        ]
        _version_notes(snap, versions)

    def trace_json(self, snap: Snapshot, part: int, row: int) -> dict[str, Any]:
        """The whole trace of one row, read from its own row group of its own part only."""
        path = snap.parts[part]
        file = pq.ParquetFile(path)
        if "trace_json" not in file.schema_arrow.names:
            return {}
        start = 0
        for group in range(file.num_row_groups):
            size = file.metadata.row_group(group).num_rows
            if row < start + size:
                text = self._group(path, file, group)[row - start].as_py()
                loaded: dict[str, Any] = json.loads(text) if text else {}
                return loaded
            start += size
        raise IndexError(f"row {row} is past the end of {path.name}")

    def _group(self, path: Path, file: pq.ParquetFile, group: int) -> pa.ChunkedArray:
        # Part files are never rewritten (a compaction writes a new name), so name and row
        # group identify the text for good.
        key = (str(path), group)
        with self._lock:
            column = self._groups.get(key)
            if column is not None:
                self._groups.move_to_end(key)
                return column
        column = file.read_row_group(group, columns=["trace_json"]).column(0)
        with self._lock:
            self._groups[key] = column
            while len(self._groups) > GROUPS_KEPT:
                self._groups.popitem(last=False)
        return column

    def row_values(self, snap: Snapshot, part: int, row: int) -> dict[str, Any]:
        """Every column of one row as stored (for the rollout page's column table)."""
        file = pq.ParquetFile(snap.parts[part])
        names = [n for n in file.schema_arrow.names if n not in HEAVY]
        start = 0
        for group in range(file.num_row_groups):
            size = file.metadata.row_group(group).num_rows
            if row < start + size:
                table = file.read_row_group(group, columns=names).slice(row - start, 1)
                values: dict[str, Any] = table.to_pylist()[0]
                return values
            start += size
        return {}

    def search(self, snap: Snapshot, text: str) -> pa.Array:
        """Indices into ``snap.rows`` whose transcript (final branch: content, reasoning and
        tool calls) contains ``text``, case-insensitively."""
        hits: list[pa.Array] = []
        offset = 0
        for file in snap.parts:
            info = file.stat()
            key = (str(file), info.st_size, info.st_mtime_ns)
            texts = self._texts.get(key)
            if texts is None:
                texts = self._texts[key] = _transcript_texts(file)
            found = pc.match_substring(texts, text, ignore_case=True)
            hits.append(pc.add(pc.indices_nonzero(pc.fill_null(found, False)), offset))
            offset += len(texts)
        if not hits:
            return pa.array([], pa.uint64())
        return pa.concat_arrays([h.cast(pa.uint64()) for h in hits])


def _read_part(file: Path) -> Part:
    handle = pq.ParquetFile(file)
    schema = handle.schema_arrow
    wanted = [
        name
        for name in schema.names
        if name in LIGHT_SCHEMA.names or (name not in KNOWN and _scalar(schema.field(name).type))
    ]
    table = conform(handle.read(columns=wanted), LIGHT_SCHEMA)
    if "task" in schema.names:
        prompts = _prompts(handle.read(columns=["task"]).column(0))
    else:
        prompts = pa.nulls(table.num_rows, pa.string())
    table = table.append_column("_prompt", prompts)
    raw = (schema.metadata or {}).get(SCHEMA_VERSION_KEY)
    return Part(table, int(raw) if raw is not None and raw.isdigit() else None)


def _transcript_texts(file: Path) -> pa.Array:
    """One string per row: its final branch's messages joined (for search), built by Arrow
    kernels rather than a Python loop over every message."""
    handle = pq.ParquetFile(file)
    if "messages" not in handle.schema_arrow.names:
        return pa.nulls(handle.metadata.num_rows, pa.string())
    column = handle.read(columns=["messages"]).column(0).combine_chunks()
    # A fresh read starts at offset 0, so the list offsets index the struct children directly.
    offsets = column.offsets
    values = column.values
    names = [f.name for f in values.type]
    joined = []
    for name in ("content", "reasoning_content", "tool_calls_json"):
        if name in names:
            texts = pc.fill_null(pc.struct_field(values, name), "")
            lists = pa.ListArray.from_arrays(offsets, texts)
            joined.append(pc.fill_null(pc.binary_join(lists, "\n"), ""))
    if not joined:
        return pa.nulls(handle.metadata.num_rows, pa.string())
    result: pa.Array = pc.binary_join_element_wise(*joined, "\n")
    return result


def _version_notes(snap: Snapshot, versions: set[int | None]) -> None:
    older = sorted(v for v in versions if v is not None and v < TRACE_SCHEMA_VERSION)
    newer = sorted(v for v in versions if v is not None and v > TRACE_SCHEMA_VERSION)
    if older:
        snap.notes.append(
            f"Written by an older vfray (trace schema version {', '.join(map(str, older))}; "
            f"this one reads version {TRACE_SCHEMA_VERSION}): columns it lacks show as empty."
        )
    if newer:
        snap.notes.append(
            f"Written by a newer vfray (trace schema version {', '.join(map(str, newer))}; "
            f"this one reads version {TRACE_SCHEMA_VERSION}): fields it does not know are shown "
            "as they are."
        )
    if None in versions:
        snap.notes.append("Some trace parts carry no schema version: not written by vfray?")
