"""Tests for the Parquet trace format: exact round trips, part directories, schema evolution,
the samples view, and that pandas, HF datasets and Ray Data open the files unchanged."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from vfray.errors import ProviderError
from vfray.trace import (
    AgentInfo,
    Message,
    PhaseTiming,
    RewardRecord,
    StopCondition,
    TaskRecord,
    Trace,
    Usage,
)
from vfray.traces import (
    SAMPLE_SCHEMA,
    TRACE_SCHEMA,
    TRACE_SCHEMA_VERSION,
    TraceWriter,
    read_traces,
    schema_version,
    table_to_traces,
    to_samples,
    traces_to_table,
    write_traces,
)

SYSTEM = Message(role="system", content="You solve arithmetic.")
USER = Message(role="user", content="What is 2+2?")


def _task(i: int) -> TaskRecord:
    return TaskRecord(key=f"task-{i}", hash=f"{i:064x}", data={"prompt": f"q{i}", "answer": i})


def _timed(trace: Trace, t0: float) -> None:
    for k, phase in enumerate(("boot", "setup", "agent", "finalize", "scoring", "teardown")):
        trace.timing[phase] = PhaseTiming(start=t0 + k, end=t0 + k + 0.5)


def multi_turn_trace(i: int = 0) -> Trace:
    """Two turns on one branch with token ids that line up, then a compaction branch."""
    trace = Trace(
        task=_task(i),
        run_id="run-1",
        episode_id=f"ep-{i}",
        rollout_index=i % 2,
        agent=AgentInfo(harness="bash", runtime="subprocess", model="m", sampling={"t": 0.7}),
    )
    reply1 = Message(
        role="assistant",
        content=None,
        tool_calls=[{"id": "c1", "type": "function", "function": {"name": "bash"}}],
    )
    tool = Message(role="tool", tool_call_id="c1", content=[{"type": "text", "text": "4\n"}])
    reply2 = Message(role="assistant", content="4", reasoning_content="easy", vendor_field=1)
    trace.record_call(
        [SYSTEM, USER],
        reply1,
        model="m",
        usage=Usage(input_tokens=5, output_tokens=2),
        prompt_token_ids=[1, 2, 3, 4, 5],
        completion_token_ids=[6, 7],
        completion_logprobs=[-0.1, -0.2],
        policy_version=3,
    )
    trace.record_call(
        [SYSTEM, USER, reply1, tool],
        reply2,
        model="m",
        usage=Usage(input_tokens=9, output_tokens=1),
        prompt_token_ids=[1, 2, 3, 4, 5, 6, 7, 8, 9],
        completion_token_ids=[10],
        completion_logprobs=[-0.3],
        policy_version=4,
    )
    # Compaction: history rewritten, so a second branch starts (no token ids recorded).
    summary = Message(role="user", content="Summary: the answer is 4. Confirm.")
    trace.record_call([SYSTEM, summary], Message(role="assistant", content="Confirmed: 4"))
    trace.rewards["correct"] = RewardRecord(value=1.0, weight=1.0)
    trace.rewards["style"] = RewardRecord(value=None, weight=0.5, error="boom")
    trace.metrics["turns"] = 3.0
    trace.metrics["missing"] = None
    trace.advantage = 0.25
    trace.stop_condition = StopCondition.COMPLETED
    trace.notes.append("style hook failed")
    _timed(trace, 1_700_000_000.0 + i)
    return trace


def failed_trace(i: int = 1) -> Trace:
    trace = Trace(task=_task(i), run_id="run-1", attempt=1)
    trace.record_call([USER], None, error=None, model="m")
    trace.add_error(ProviderError("upstream 503"), phase="agent")
    trace.stop_condition = StopCondition.ERROR
    trace.timing["boot"] = PhaseTiming(start=1_700_000_000.0)
    return trace


def empty_trace() -> Trace:
    return Trace(task=_task(99))


def odd_floats_trace() -> Trace:
    trace = multi_turn_trace(7)
    trace.metrics["nan"] = math.nan
    trace.metrics["inf"] = -math.inf
    return trace


def _dumps(traces: list[Trace]) -> list[Any]:
    return [t.model_dump() for t in traces]


def _same(a: list[Trace], b: list[Trace]) -> None:
    # NaN != NaN, so compare through repr, which is stable for NaN and infinities.
    assert repr(_dumps(a)) == repr(_dumps(b))


@pytest.fixture
def traces() -> list[Trace]:
    return [multi_turn_trace(0), failed_trace(1), multi_turn_trace(2), empty_trace()]


def test_round_trip_in_memory(traces: list[Trace]) -> None:
    table = traces_to_table(traces)
    assert table.schema.equals(TRACE_SCHEMA)
    assert table.num_rows == len(traces)
    _same(table_to_traces(table), traces)


def test_round_trip_keeps_nan_and_infinity() -> None:
    trace = odd_floats_trace()
    back = table_to_traces(traces_to_table([trace]))[0]
    assert math.isnan(back.metrics["nan"] or 0.0)
    assert back.metrics["inf"] == -math.inf
    _same([back], [trace])


def test_view_columns(traces: list[Trace]) -> None:
    rows = traces_to_table(traces).to_pylist()
    ok, failed = rows[0], rows[1]
    assert ok["task_key"] == "task-0" and json.loads(ok["task"]) == {"prompt": "q0", "answer": 0}
    assert ok["reward"] == 1.0 and ok["advantage"] == 0.25
    assert ok["rewards"] == [{"key": "correct", "value": 1.0}, {"key": "style", "value": None}]
    assert ok["metrics"] == [{"key": "turns", "value": 3.0}, {"key": "missing", "value": None}]
    assert ok["ok"] is True and ok["stop_condition"] == "completed" and ok["terminated"] is True
    assert (ok["num_turns"], ok["num_calls"], ok["num_branches"]) == (3, 3, 2)
    assert (ok["input_tokens"], ok["output_tokens"]) == (14, 3)
    assert (ok["model"], ok["harness"], ok["runtime"]) == ("m", "bash", "subprocess")
    assert ok["boot_s"] == 0.5 and ok["duration_s"] == 5.5 and ok["policy_version"] == 3
    assert ok["started_at"].timestamp() == 1_700_000_000.0
    # The final conversation is the compaction branch, the one the last call grew.
    assert [m["content"] for m in ok["messages"]] == [
        "You solve arithmetic.",
        "Summary: the answer is 4. Confirm.",
        "Confirmed: 4",
    ]
    assert failed["ok"] is False and failed["error_type"] == "ProviderError"
    assert failed["error_message"] == "upstream 503" and failed["error_phase"] == "agent"
    assert failed["reward"] is None and failed["num_turns"] == 0 and failed["attempt"] == 1


def test_structured_messages_keep_raw_json() -> None:
    trace = multi_turn_trace()
    branch0 = to_samples([trace]).to_pylist()[0]["messages"]
    assistant, tool, final = branch0[2], branch0[3], branch0[4]
    assert assistant["content"] is None and "bash" in assistant["tool_calls_json"]
    assert tool["content"] == "4\n" and tool["tool_call_id"] == "c1"
    assert Message.model_validate_json(tool["raw_json"]) == trace.graph[tool["id"]]
    assert final["reasoning_content"] == "easy" and '"vendor_field":1' in final["raw_json"]
    assert branch0[1]["raw_json"] is None  # plain text says it all


def test_write_file_and_read(tmp_path: Path, traces: list[Trace]) -> None:
    path = write_traces(traces, tmp_path / "traces.parquet")
    assert path == tmp_path / "traces.parquet"
    assert schema_version(pq.read_schema(path)) == TRACE_SCHEMA_VERSION
    table = read_traces(path)
    assert table.column("schema_version").to_pylist() == [TRACE_SCHEMA_VERSION] * len(traces)
    _same(table_to_traces(table), traces)
    with pytest.raises(FileExistsError):
        write_traces(traces, path)
    write_traces(traces[:1], path, overwrite=True)
    assert read_traces(path).num_rows == 1


def test_directory_of_parts_never_overwrites(tmp_path: Path, traces: list[Trace]) -> None:
    folder = tmp_path / "traces"
    first = write_traces(traces[:2], folder)
    second = write_traces(traces_to_table(traces[2:]), folder)
    assert (first.name, second.name) == ("part-00000.parquet", "part-00001.parquet")
    _same(table_to_traces(read_traces(folder)), traces)
    assert [p.name for p in sorted(folder.iterdir())] == [first.name, second.name]
    # A part written by someone else with a higher number is skipped past, never replaced.
    (folder / "part-00007.parquet").write_bytes(first.read_bytes())
    assert write_traces(traces[:1], folder).name == "part-00008.parquet"
    assert read_traces(folder).num_rows == len(traces) + 2 + 1


def test_trace_writer_flushes_by_rows(tmp_path: Path) -> None:
    folder = tmp_path / "sink"
    many = [multi_turn_trace(i) for i in range(5)]
    with TraceWriter(folder, flush_rows=2) as writer:
        assert writer.write(many[:1]) == []
        assert [p.name for p in writer.write(many[1:3])] == ["part-00000.parquet"]
        assert writer.buffered_rows == 1
        assert len(writer.write(traces_to_table(many[3:]))) == 1
    assert writer.rows_written == 5
    assert [pq.read_metadata(p).num_rows for p in writer.parts] == [2, 2, 1]
    _same(table_to_traces(read_traces(folder)), many)
    with pytest.raises(ValueError, match="closed"):
        writer.write(many)


def test_schema_evolution_fills_missing_columns(tmp_path: Path) -> None:
    folder = tmp_path / "mixed"
    current = traces_to_table([multi_turn_trace(1)])
    # An "older" part: fewer columns, a narrower integer type, and no file metadata.
    old = current.drop_columns(["policy_version", "error_phase", "trace_json"])
    old = old.set_column(
        old.schema.get_field_index("num_turns"), "num_turns", old["num_turns"].cast(pa.int32())
    ).replace_schema_metadata(None)
    folder.mkdir()
    pq.write_table(old, folder / "part-00000.parquet")
    write_traces([multi_turn_trace(2)], folder)
    table = read_traces(folder)
    assert table.schema.names == TRACE_SCHEMA.names
    assert table.column("policy_version").to_pylist() == [None, 3]
    assert table.column("num_turns").type == pa.int64()
    assert table.column("trace_json").null_count == 1
    assert read_traces(folder, columns=["trace_id", "reward"]).column_names == [
        "trace_id",
        "reward",
    ]


def test_samples_one_row_per_branch(traces: list[Trace]) -> None:
    samples = to_samples(traces)
    assert samples.schema.equals(SAMPLE_SCHEMA)
    expected = sum(len(t.branch_list) for t in traces)
    assert samples.num_rows == expected == 2 + 1 + 2 + 0
    assert to_samples(traces_to_table(traces)).equals(samples)
    first, compacted = samples.to_pylist()[:2]
    assert (first["branch"], compacted["branch"]) == (0, 1)
    assert first["prompt_token_ids"] == [1, 2, 3, 4, 5]
    assert first["completion_token_ids"] == [6, 7, 8, 9, 10]
    assert first["completion_mask"] == [1, 1, 0, 0, 1]
    assert first["completion_logprobs"] == [-0.1, -0.2, 0.0, 0.0, -0.3]
    assert first["reward"] == 1.0 and first["advantage"] == 0.25 and first["policy_version"] == 3
    assert [m["role"] for m in first["messages"]] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    assert compacted["prompt_token_ids"] is None and compacted["completion_token_ids"] is None


def test_samples_refuse_misaligned_tokens() -> None:
    trace = Trace(task=_task(3))
    reply = Message(role="assistant", content="a")
    trace.record_call([USER], reply, prompt_token_ids=[1, 2], completion_token_ids=[3])
    # The history was re-tokenized differently: [1, 2, 3] is not a prefix of [1, 9, 3, 4].
    trace.record_call(
        [USER, reply, USER], reply, prompt_token_ids=[1, 9, 3, 4], completion_token_ids=[5]
    )
    row = to_samples([trace]).to_pylist()[0]
    assert row["completion_token_ids"] is None and len(row["messages"]) == 4


def _write_dir(tmp_path: Path, traces: list[Trace]) -> Path:
    folder = tmp_path / "run" / "traces"
    write_traces(traces[:2], folder)
    write_traces(traces[2:], folder)
    return folder


def test_pandas_reads_files(tmp_path: Path, traces: list[Trace]) -> None:
    import pandas as pd

    folder = _write_dir(tmp_path, traces)
    frame = pd.read_parquet(folder)
    assert len(frame) == len(traces)
    assert list(frame["task_key"]) == [t.task.key for t in traces]
    assert frame["reward"].iloc[0] == 1.0 and pd.isna(frame["reward"].iloc[1])
    samples_path = tmp_path / "samples.parquet"
    pq.write_table(to_samples(traces), samples_path)
    assert len(pd.read_parquet(samples_path)) == 5


def test_hf_datasets_reads_files(
    tmp_path: Path, traces: list[Trace], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    import datasets

    file = write_traces(traces, tmp_path / "one.parquet")
    cache = str(tmp_path / "hf-cache")
    ds = datasets.Dataset.from_parquet(str(file), cache_dir=cache)
    assert isinstance(ds, datasets.Dataset) and ds.num_rows == len(traces)
    assert ds[0]["messages"][-1]["content"] == "Confirmed: 4"
    assert ds[0]["rewards"][0] == {"key": "correct", "value": 1.0}
    folder = _write_dir(tmp_path, traces)
    loaded = datasets.load_dataset(
        "parquet", data_files=str(folder / "part-*.parquet"), split="train", cache_dir=cache
    )
    assert sorted(loaded["trace_id"]) == sorted(t.trace_id for t in traces)
    _same(table_to_traces(loaded.data.table), traces)


@pytest.mark.usefixtures("ray_local")
def test_ray_data_reads_files(tmp_path: Path, traces: list[Trace]) -> None:
    # The suite's shared local Ray (tests/conftest.py: loopback, token auth on).
    import ray

    folder = _write_dir(tmp_path, traces)
    ds = ray.data.read_parquet(str(folder))
    rows = ds.take_all()
    assert len(rows) == len(traces)
    assert {r["trace_id"] for r in rows} == {t.trace_id for t in traces}
    assert rows[0]["messages"][0]["role"] in {"system", "user"}
    assert "trace_json" in ds.schema().names
    samples = tmp_path / "samples"
    sample_table = to_samples(traces)
    samples.mkdir()
    pq.write_table(sample_table, samples / "part-00000.parquet")
    assert ray.data.read_parquet(str(samples)).count() == sample_table.num_rows
