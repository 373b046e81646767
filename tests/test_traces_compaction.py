"""Compacting a run folder's Parquet parts: every row kept exactly once whatever step a
compaction died at, resumed runs that append parts and compact again, readers over a mix of
compacted and new parts, and the TraceSink compacting when it closes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from vfray.run.results import RunResult
from vfray.run.sink import TraceSink
from vfray.trace import Message, RewardRecord, TaskRecord, Trace, Usage
from vfray.traces import TRACE_SCHEMA, TraceWriter, read_traces, traces_to_table, write_traces
from vfray.traces.episodes import EPISODE_SCHEMA
from vfray.traces.io import compact_parts, parquet_files
from vfray.traces.parts import REPLACES_KEY


def make_trace(i: int) -> Trace:
    trace = Trace(
        task=TaskRecord(key=f"task-{i}", hash=f"{i:064x}", data={"q": i}),
        run_id="run",
        episode_id=f"ep-{i}",
    )
    trace.record_call(
        [Message(role="user", content=f"question {i}")],
        Message(role="assistant", content=f"answer {i}"),
        model="m",
        usage=Usage(input_tokens=3, output_tokens=2),
    )
    trace.rewards["correct"] = RewardRecord(value=float(i % 2))
    return trace


def write_parts(folder: Path, start: int, sizes: list[int]) -> list[str]:
    """One part per size (as a sink flushing on a timer does); returns the trace ids in order."""
    ids: list[str] = []
    i = start
    for size in sizes:
        traces = [make_trace(j) for j in range(i, i + size)]
        write_traces(traces, folder)
        ids += [t.trace_id for t in traces]
        i += size
    return ids


def ids_of(path: Path) -> list[str]:
    ids: list[str] = read_traces(path, columns=["trace_id"]).column("trace_id").to_pylist()
    return ids


def names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_compaction_merges_parts_in_order_with_zstd(tmp_path: Path) -> None:
    folder = tmp_path / "traces"
    ids = write_parts(folder, 0, [3, 1, 5, 2, 4])
    before = read_traces(folder)
    merged = compact_parts(folder)
    assert merged is not None and names(folder) == ["part-00005-compacted.parquet"]
    assert ids_of(folder) == ids
    assert read_traces(folder).equals(before)
    meta = pq.ParquetFile(merged).metadata
    assert meta.num_rows == 15 and meta.num_row_groups == 1
    assert meta.row_group(0).column(0).compression == "ZSTD"
    # Nothing to do twice, or for an absent or single-part directory.
    assert compact_parts(folder) is None
    assert compact_parts(tmp_path / "absent") is None


def test_row_groups_are_bounded_by_bytes(tmp_path: Path) -> None:
    folder = tmp_path / "traces"
    write_parts(folder, 0, [10] * 6)
    one_part = traces_to_table([make_trace(i) for i in range(10)]).nbytes
    merged = compact_parts(folder, row_group_bytes=2 * one_part)
    assert merged is not None
    meta = pq.read_metadata(merged)
    assert [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == [20, 20, 20]


def test_crash_between_link_and_unlink_keeps_every_row_once(tmp_path: Path) -> None:
    folder, backup = tmp_path / "traces", tmp_path / "backup"
    ids = write_parts(folder, 0, [2, 3, 4])
    shutil.copytree(folder, backup)
    merged = compact_parts(folder)
    assert merged is not None
    # The process died after linking the merged part in and after deleting only the first
    # old part: the other two are still there, next to the part that holds their rows.
    for name in ["part-00001.parquet", "part-00002.parquet"]:
        shutil.copy2(backup / name, folder / name)
    assert [p.name for p in parquet_files(folder)] == [merged.name]
    assert ids_of(folder) == ids
    assert RunResult(tmp_path).traces.num_rows == len(ids)
    # The next compaction finishes the job: the leftovers go, the merged part stays.
    assert compact_parts(folder) is None
    assert names(folder) == [merged.name]
    assert ids_of(folder) == ids


def test_crash_before_link_leaves_only_a_hidden_file(tmp_path: Path) -> None:
    folder, scratch = tmp_path / "traces", tmp_path / "scratch"
    ids = write_parts(folder, 0, [2, 3])
    shutil.copytree(folder, scratch)
    merged = compact_parts(scratch)
    assert merged is not None
    # The merged file was fully written under its temporary name, never linked in.
    shutil.copy2(merged, folder / ".compact-0123456789abcdef.parquet")
    assert ids_of(folder) == ids
    again = compact_parts(folder)
    assert again is not None and names(folder) == [again.name]
    assert ids_of(folder) == ids


def test_resume_appends_then_compacts_again(tmp_path: Path) -> None:
    folder = tmp_path / "traces"
    ids = write_parts(folder, 0, [2, 2])
    first = compact_parts(folder)
    assert first is not None
    # A resumed run appends parts after the compacted one; a reader sees both, in order.
    ids += write_parts(folder, 4, [3, 1])
    assert [p.name for p in parquet_files(folder)] == [
        first.name,
        "part-00003.parquet",
        "part-00004.parquet",
    ]
    assert ids_of(folder) == ids
    second = compact_parts(folder)
    assert second is not None and names(folder) == ["part-00005-compacted.parquet"]
    assert ids_of(folder) == ids
    replaced = pq.read_schema(second).metadata[REPLACES_KEY]
    assert b"part-00002-compacted.parquet" in replaced


def test_crash_in_a_second_compaction_skips_a_chain_of_replaced_parts(tmp_path: Path) -> None:
    folder, backup = tmp_path / "traces", tmp_path / "backup"
    ids = write_parts(folder, 0, [2, 2])
    shutil.copytree(folder, backup)
    first = compact_parts(folder)
    assert first is not None
    ids += write_parts(folder, 4, [1])
    for file in folder.iterdir():
        shutil.copy2(file, backup / file.name)
    second = compact_parts(folder)
    assert second is not None
    # Every file either compaction deleted is back: the first merged part, the parts it
    # replaced, and the part appended after it. Only the second merged part counts.
    for file in backup.iterdir():
        shutil.copy2(file, folder / file.name)
    assert len(names(folder)) == 5
    assert [p.name for p in parquet_files(folder)] == [second.name]
    assert ids_of(folder) == ids
    assert compact_parts(folder) is None and names(folder) == [second.name]


def test_mixed_schemas_merge_into_their_union(tmp_path: Path) -> None:
    folder = tmp_path / "traces"
    folder.mkdir()
    current = traces_to_table([make_trace(0), make_trace(1)])
    # An "older" part: fewer columns, a narrower integer type, no file metadata.
    old = current.drop_columns(["policy_version", "trace_json"])
    old = old.set_column(
        old.schema.get_field_index("num_turns"), "num_turns", old["num_turns"].cast(pa.int32())
    ).replace_schema_metadata(None)
    pq.write_table(old, folder / "part-00000.parquet")
    write_traces(current, folder)
    # A part from a newer vfray with a column this one does not know.
    newer = current.append_column("novel", pa.array(["a", "b"]))
    write_traces(newer, folder)
    before = read_traces(folder).to_pylist()
    merged = compact_parts(folder)
    assert merged is not None
    schema = pq.read_schema(merged)
    assert schema.field("num_turns").type == pa.int64()
    assert schema.field("policy_version").nullable and "novel" in schema.names
    table = read_traces(folder)
    assert table.schema.names[: len(TRACE_SCHEMA)] == TRACE_SCHEMA.names
    assert table.to_pylist() == before
    assert table.column("novel").to_pylist() == [None] * 4 + ["a", "b"]


def test_incompatible_parts_are_left_as_they_are(tmp_path: Path) -> None:
    folder = tmp_path / "traces"
    folder.mkdir()
    pq.write_table(pa.table({"x": pa.array([1.5])}), folder / "part-00000.parquet")
    pq.write_table(pa.table({"x": pa.array([[1]])}), folder / "part-00001.parquet")
    with pytest.raises(TypeError, match="disagree"):
        compact_parts(folder)
    assert names(folder) == ["part-00000.parquet", "part-00001.parquet"]


def test_reader_keeps_conforming_parts_of_other_schemas(tmp_path: Path) -> None:
    folder = tmp_path / "traces"
    ids = write_parts(folder, 0, [2, 2])
    old = traces_to_table([make_trace(9)]).drop_columns(["trace_json"])
    pq.write_table(old.replace_schema_metadata(None), folder / "part-00002.parquet")
    ids += old.column("trace_id").to_pylist()
    ids += write_parts(folder, 10, [1, 3])
    table = read_traces(folder)
    assert table.column("trace_id").to_pylist() == ids
    assert table.column("trace_json").null_count == 1
    assert table.column("trace_json")[4].as_py() is None
    # Projecting onto a column one part lacks still gives that part's rows (as nulls).
    projected = read_traces(folder, columns=["trace_json"]).column("trace_json")
    assert len(projected) == len(ids) and projected[4].as_py() is None


def test_only_part_files_are_compacted(tmp_path: Path) -> None:
    folder = tmp_path / "traces"
    ids = write_parts(folder, 0, [1, 1])
    # A file someone else put there is read, but never merged (nor deleted).
    write_traces([make_trace(5)], folder / "extra.parquet")
    assert len(ids_of(folder)) == 3
    merged = compact_parts(folder)
    assert merged is not None
    assert names(folder) == ["extra.parquet", merged.name]
    assert ids_of(folder)[1:] == ids


def test_parts_past_99999_stay_in_numeric_order(tmp_path: Path) -> None:
    folder = tmp_path / "traces"
    folder.mkdir()
    for index, i in [(99_999, 0), (100_000, 1), (100_001, 2)]:
        pq.write_table(traces_to_table([make_trace(i)]), folder / f"part-{index:05d}.parquet")
    expected = [read_traces(folder / f"part-{n:05d}.parquet") for n in (99_999, 100_000, 100_001)]
    assert ids_of(folder) == [t.column("trace_id")[0].as_py() for t in expected]
    assert write_traces([make_trace(3)], folder).name == "part-100002.parquet"


def episode_rows(start: int, count: int) -> pa.Table:
    rows = [
        {
            "schema_version": 1,
            "episode_id": f"ep-{i}",
            "task_key": f"task-{i}",
            "task_hash": f"{i:064x}",
            "n": 1,
            "rewards": [float(i % 2)],
        }
        for i in range(start, start + count)
    ]
    return pa.Table.from_pylist(rows, schema=EPISODE_SCHEMA)


async def run_sink(run_dir: Path, start: int, batches: list[int]) -> list[str]:
    sink = TraceSink(str(run_dir), {"name": "run"}, flush_rows=1000, flush_seconds=3600)
    ids: list[str] = []
    i = start
    for size in batches:
        traces = [make_trace(j) for j in range(i, i + size)]
        ids += [t.trace_id for t in traces]
        await sink.append(traces_to_table(traces), episode_rows(i, size), key=f"ep-{i}")
        await sink.flush()  # as the timer does: one small part per batch
        i += size
    assert len(parquet_files(run_dir / "traces")) >= len(batches)
    assert await sink.close() == len(ids)
    return ids


async def test_sink_close_compacts_and_a_resumed_run_compacts_again(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    ids = await run_sink(run_dir, 0, [2, 3, 1])
    for table in ("traces", "episodes"):
        files = parquet_files(run_dir / table)
        assert len(files) == 1 and files[0].name.endswith("-compacted.parquet")
    result = RunResult(run_dir)
    assert result.traces.column("trace_id").to_pylist() == ids
    assert result.episodes.column("episode_id").to_pylist() == [f"ep-{i}" for i in range(6)]
    assert result.episodes.schema.names == EPISODE_SCHEMA.names
    # Resume: a new sink on the same folder appends parts, then closes into one part again.
    ids += await run_sink(run_dir, 6, [2, 2])
    assert [len(parquet_files(run_dir / t)) for t in ("traces", "episodes")] == [1, 1]
    result = RunResult(run_dir)
    assert result.traces.column("trace_id").to_pylist() == ids
    assert result.episodes.num_rows == 10
    assert result.summary()["rollouts"] == 10


async def test_sink_without_compaction_keeps_its_parts(tmp_path: Path) -> None:
    sink = TraceSink(str(tmp_path), {}, flush_seconds=3600, compact=False)
    for i in range(3):
        await sink.append(traces_to_table([make_trace(i)]))
        await sink.flush()
    await sink.close()
    assert len(parquet_files(tmp_path / "traces")) == 3
    assert RunResult(tmp_path).traces.num_rows == 3


def test_trace_writer_parts_and_compaction_agree(tmp_path: Path) -> None:
    folder = tmp_path / "traces"
    traces = [make_trace(i) for i in range(25)]
    with TraceWriter(folder, flush_rows=4) as writer:
        writer.write(traces)
    assert len(writer.parts) == 7
    before = read_traces(folder)
    compact_parts(folder)
    assert read_traces(folder).equals(before)
    assert read_traces(folder, columns=["reward", "trace_id"]).column_names == [
        "reward",
        "trace_id",
    ]
