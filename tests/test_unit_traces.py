"""vfray.traces.io at its edges: a part whose column cannot be read as today's type, a projection
over parts of different layouts, a corrupt part in a folder named as the one to move out, a
single-file write that will not overwrite, and a writer whose failed flush keeps its rows.
tests/test_traces_io.py and tests/test_traces_compaction.py cover the common paths."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from vfray.errors import RunFolderError
from vfray.trace import RewardRecord, TaskRecord, Trace
from vfray.traces.io import TraceWriter, conform, read_traces, traces_to_table, write_traces
from vfray.traces.schema import TRACE_SCHEMA


def _traces(n: int, start: int = 0) -> list[Trace]:
    out = []
    for i in range(start, start + n):
        trace = Trace(task=TaskRecord(key=f"t{i}", hash="h"), rollout_index=i)
        trace.rewards["r"] = RewardRecord(value=float(i))
        out.append(trace)
    return out


def test_conform_fills_casts_and_keeps_unknown_columns_last() -> None:
    table = pa.table(
        {
            "lane": pa.array(["red"]),  # a newer writer's column
            "rollout_index": pa.array([3], pa.int32()),  # an older, narrower type
            "task_key": pa.array(["k"]),
        }
    )
    laid_out = conform(table, TRACE_SCHEMA)
    assert laid_out.column_names == [*TRACE_SCHEMA.names, "lane"]
    assert laid_out.schema.field("rollout_index").type == TRACE_SCHEMA.field("rollout_index").type
    assert laid_out.column("rollout_index").to_pylist() == [3]
    assert laid_out.column("reward").to_pylist() == [None]  # missing: nulls
    assert laid_out.schema.field("reward").nullable


def test_a_column_that_cannot_be_read_as_todays_type_is_named() -> None:
    table = pa.table({"rollout_index": pa.array(["not a number"])})
    with pytest.raises(TypeError, match=r"trace column 'rollout_index' has type string, which"):
        conform(table, TRACE_SCHEMA)


def test_a_projection_reads_across_parts_of_different_layouts(tmp_path: Path) -> None:
    folder = tmp_path / "traces"
    old = traces_to_table(_traces(2)).drop_columns(["advantage", "metrics"])
    write_traces(old, folder)
    write_traces(_traces(2, start=2), folder)
    table = read_traces(folder, columns=["task_key", "advantage"])
    assert table.column_names == ["task_key", "advantage"]
    assert table.column("task_key").to_pylist() == ["t0", "t1", "t2", "t3"]  # row order kept
    assert table.column("advantage").to_pylist() == [None] * 4
    (tmp_path / "nothing-yet").mkdir()  # a run that has written no part yet
    empty = read_traces(tmp_path / "nothing-yet", columns=["task_key"])
    assert (empty.num_rows, empty.column_names) == (0, ["task_key"])


def test_a_corrupt_part_among_good_ones_is_named(tmp_path: Path) -> None:
    folder = tmp_path / "traces"
    first = write_traces(_traces(2), folder)
    second = write_traces(_traces(2, start=2), folder)
    second.write_bytes(first.read_bytes()[: len(first.read_bytes()) // 2])
    with pytest.raises(RunFolderError) as info:
        read_traces(folder)
    message = str(info.value)
    assert message.startswith(f"cannot read {second}: ")
    assert "move it out of the folder to read the rest" in message and "\n" not in message


def test_a_single_file_is_not_overwritten_unless_asked(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "run.parquet"
    assert write_traces(_traces(1), path) == path
    with pytest.raises(FileExistsError, match="pass overwrite=True or write to a directory"):
        write_traces(_traces(3), path)
    write_traces(_traces(3), path, overwrite=True)
    assert pq.read_metadata(path).num_rows == 3


def test_a_failed_flush_keeps_every_row_for_the_next(tmp_path: Path) -> None:
    folder = tmp_path / "traces"
    writer = TraceWriter(folder, flush_rows=100)
    assert writer.write(_traces(3)) == [] and writer.buffered_rows == 3
    assert writer.write([]) == []
    shutil.rmtree(folder)
    folder.write_text("a file where the folder was")  # the part cannot be written
    with pytest.raises(OSError):
        writer.flush()
    assert writer.buffered_rows == 3 and writer.parts == []
    folder.unlink()
    part = writer.flush()
    assert part is not None and pq.read_metadata(part).num_rows == 3
    assert (writer.rows_written, writer.buffered_rows, writer.flush()) == (3, 0, None)
    writer.close()
    writer.close()  # once is enough
    with pytest.raises(ValueError, match="TraceWriter is closed"):
        writer.write(_traces(1))
    with pytest.raises(ValueError, match="flush_rows must be at least 1, got 0"):
        TraceWriter(tmp_path / "other", flush_rows=0)


def test_a_large_write_is_cut_into_parts_of_flush_rows(tmp_path: Path) -> None:
    with TraceWriter(tmp_path, flush_rows=2) as writer:
        written = writer.write(_traces(5))
        assert [pq.read_metadata(p).num_rows for p in written] == [2, 2]
        assert writer.buffered_rows == 1
    assert [pq.read_metadata(p).num_rows for p in writer.parts] == [2, 2, 1]
    assert read_traces(tmp_path).column("rollout_index").to_pylist() == [0, 1, 2, 3, 4]
