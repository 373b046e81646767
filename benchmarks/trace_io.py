"""Trace IO throughput: vfray Parquet (``TraceWriter``/``read_traces``) versus the verifiers-style
JSONL baseline (``json.dumps(trace.model_dump())`` per line), in rows per second; and a run
folder as the TraceSink leaves it (a small part per flush) before and after ``compact_parts``.

Run: ``python benchmarks/trace_io.py [--rows 100000] [--part-rows 100] [--repeat 3]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pyarrow as pa

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
from vfray.traces import TraceWriter, read_traces, table_to_traces, traces_to_table
from vfray.traces.io import compact_parts

T = TypeVar("T")
BATCH = 10_000
SYSTEM = Message(role="system", content="You are a careful assistant. Use the bash tool. " * 3)


def make_trace(i: int, rng: random.Random) -> Trace:
    """A realistic small rollout: system + user prompt, a tool call, a tool result, an answer."""
    a, b = rng.randrange(1000), rng.randrange(1000)
    trace = Trace(
        task=TaskRecord(
            key=f"task-{i}", hash=f"{i:064x}", data={"prompt": f"{a}+{b}", "answer": a + b}
        ),
        run_id="bench",
        episode_id=f"ep-{i // 4}",
        rollout_index=i % 4,
        agent=AgentInfo(
            harness="bash", runtime="subprocess", model="small", sampling={"temperature": 1.0}
        ),
    )
    user = Message(role="user", content=f"Compute {a} + {b} and explain your steps briefly.")
    call = Message(
        role="assistant",
        content="I will use bash.",
        tool_calls=[
            {
                "id": f"c{i}",
                "type": "function",
                "function": {
                    "name": "bash",
                    "arguments": json.dumps({"cmd": f"echo $(({a}+{b}))"}),
                },
            }
        ],
    )
    tool = Message(role="tool", tool_call_id=f"c{i}", content=f"{a + b}\n")
    answer = Message(role="assistant", content=f"The sum of {a} and {b} is {a + b}. " * 4)
    t0 = 1_700_000_000.0 + i
    trace.record_call(
        [SYSTEM, user],
        call,
        model="small",
        usage=Usage(input_tokens=80, output_tokens=20),
        started_at=t0,
        ended_at=t0 + 0.4,
    )
    trace.record_call(
        [SYSTEM, user, call, tool],
        answer,
        model="small",
        usage=Usage(input_tokens=110, output_tokens=40),
        started_at=t0 + 0.5,
        ended_at=t0 + 1.1,
    )
    trace.rewards["correct"] = RewardRecord(value=float(rng.random() < 0.7))
    trace.metrics["num_tool_calls"] = 1.0
    trace.stop_condition = StopCondition.COMPLETED
    for k, phase in enumerate(("boot", "setup", "agent", "finalize", "scoring", "teardown")):
        trace.timing[phase] = PhaseTiming(start=t0 + k, end=t0 + k + 0.3)
    return trace


def timed(fn: Callable[[], T], repeat: int = 1) -> tuple[T, float]:
    """Result and best wall time of ``repeat`` runs (the best is the least disturbed by
    other processes on a shared machine)."""
    best = math.inf
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return result, best


def write_parquet(traces: list[Trace], folder: Path) -> None:
    with TraceWriter(folder, flush_rows=BATCH) as writer:
        for i in range(0, len(traces), BATCH):
            writer.write(traces[i : i + BATCH])


def write_small_parts(tables: list[pa.Table], folder: Path) -> None:
    """As the TraceSink does during a run: one part per timed flush of a few rows."""
    with TraceWriter(folder, flush_rows=1 << 30) as writer:
        for table in tables:
            writer.write(table)
            writer.flush()


def write_jsonl(traces: list[Trace], path: Path) -> None:
    with path.open("w") as f:
        for trace in traces:
            f.write(json.dumps(trace.model_dump()) + "\n")


def read_jsonl_dicts(path: Path) -> list[dict[str, object]]:
    with path.open() as f:
        return [json.loads(line) for line in f]


def read_jsonl_traces(path: Path) -> list[Trace]:
    with path.open() as f:
        return [Trace.model_validate(json.loads(line)) for line in f]


def size_mb(path: Path) -> float:
    files = [path] if path.is_file() else list(path.iterdir())
    return sum(p.stat().st_size for p in files) / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument(
        "--part-rows", type=int, default=100, help="rows per part in the sink-like run folder"
    )
    parser.add_argument("--repeat", type=int, default=1, help="best of this many runs")
    args = parser.parse_args()
    n: int = args.rows
    r: int = args.repeat
    part_rows: int = args.part_rows
    rng = random.Random(0)
    traces, t_make = timed(lambda: [make_trace(i, rng) for i in range(n)])
    # Converted up front: the sink receives Arrow tables, so its write is the Parquet part.
    small = [traces_to_table(traces[i : i + part_rows]) for i in range(0, n, part_rows)]
    # The fixture heap is long-lived; freezing it keeps the cyclic GC from re-scanning it during
    # every timed run, so the figures measure the per-row work of each format.
    gc.freeze()
    print(f"built {n:,} traces in {t_make:.1f} s ({len(traces[0].graph)} messages each)")

    with tempfile.TemporaryDirectory() as tmp:
        folder, jsonl = Path(tmp) / "traces", Path(tmp) / "traces.jsonl"
        parts, compacted = Path(tmp) / "parts", Path(tmp) / "compacted"
        # Warm up both paths (lazy imports, codec setup) so neither pays it inside the timing.
        write_parquet(traces[:100], Path(tmp) / "warm")
        table_to_traces(read_traces(Path(tmp) / "warm"))
        write_jsonl(traces[:100], Path(tmp) / "warm.jsonl")
        read_jsonl_traces(Path(tmp) / "warm.jsonl")
        # Each Parquet write run gets its own folder: TraceWriter appends, never overwrites.
        runs = iter(range(r))
        _, pq_write = timed(lambda: write_parquet(traces, folder / str(next(runs))), r)
        folder = folder / "0"
        runs = iter(range(r))
        _, sink_write = timed(lambda: write_small_parts(small, parts / str(next(runs))), r)
        parts = parts / "0"
        # Compaction replaces its input, so each run compacts a fresh copy of the parts.
        copies = []
        for i in range(r):
            shutil.copytree(parts, compacted / str(i))
            copies.append(compacted / str(i))
        runs = iter(range(r))
        _, t_compact = timed(lambda: compact_parts(copies[next(runs)]), r)
        compacted = copies[0]
        _, js_write = timed(lambda: write_jsonl(traces, jsonl), r)
        # Keep only counts: holding every read-back copy would triple the memory used.
        rows = [0] * 6
        rows[0], pq_read_table = timed(lambda: read_traces(folder).num_rows, r)
        rows[1], pq_read_traces = timed(lambda: len(table_to_traces(read_traces(folder))), r)
        rows[2], parts_read = timed(lambda: read_traces(parts).num_rows, r)
        rows[3], compacted_read = timed(lambda: read_traces(compacted).num_rows, r)
        rows[4], js_read_dicts = timed(lambda: len(read_jsonl_dicts(jsonl)), r)
        rows[5], js_read_traces = timed(lambda: len(read_jsonl_traces(jsonl)), r)
        if rows != [n] * 6:
            raise RuntimeError(f"read back {rows} rows, expected {n} each")
        pq_mb, js_mb = size_mb(folder), size_mb(jsonl)
        parts_mb, compacted_mb = size_mb(parts), size_mb(compacted)
        n_parts = len(list(parts.iterdir()))

    def rate(seconds: float) -> str:
        return f"{n / seconds:>12,.0f} rows/s"

    many = f"{n_parts} parts of {part_rows}"
    print(f"{'':44}{'rows/s':>19}")
    print(f"{f'write  parquet ({BATCH:,}-row parts)':44}{rate(pq_write)}")
    print(f"{f'write  parquet ({many})':44}{rate(sink_write)}")
    print(f"{f'compact {many} -> 1':44}{rate(t_compact)}")
    print(f"{'write  jsonl (json.dumps(model_dump))':44}{rate(js_write)}")
    print(f"{f'read   parquet ({BATCH:,}-row parts) -> Arrow':44}{rate(pq_read_table)}")
    print(f"{f'read   parquet ({BATCH:,}-row parts) -> Trace':44}{rate(pq_read_traces)}")
    print(f"{f'read   parquet ({many}) -> Arrow':44}{rate(parts_read)}")
    print(f"{'read   parquet (compacted) -> Arrow':44}{rate(compacted_read)}")
    print(f"{'read   jsonl -> dicts (json.loads)':44}{rate(js_read_dicts)}")
    print(f"{'read   jsonl -> Trace objects':44}{rate(js_read_traces)}")
    print(
        f"size   parquet {pq_mb:.1f} MB   {many} {parts_mb:.1f} MB   "
        f"compacted {compacted_mb:.1f} MB   jsonl {js_mb:.1f} MB"
    )
    print(f"ratio  write   parquet/jsonl {js_write / pq_write:.2f}x")
    print(f"ratio  read    parquet table / jsonl dicts {js_read_dicts / pq_read_table:.2f}x")
    print(f"ratio  read    {many} / jsonl dicts {js_read_dicts / parts_read:.2f}x")
    print(f"ratio  read    compacted / jsonl dicts {js_read_dicts / compacted_read:.2f}x")
    print(f"ratio  read    parquet traces / jsonl traces {js_read_traces / pq_read_traces:.2f}x")


if __name__ == "__main__":
    main()
