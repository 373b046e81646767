"""Trace IO throughput: vfray Parquet (``TraceWriter``/``read_traces``) versus the verifiers-style
JSONL baseline (``json.dumps(trace.model_dump())`` per line), in rows per second.

Run: ``python benchmarks/trace_io.py [--rows 100000]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

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
from vfray.traces import TraceWriter, read_traces, table_to_traces

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
    parser.add_argument("--repeat", type=int, default=1, help="best of this many runs")
    args = parser.parse_args()
    n: int = args.rows
    r: int = args.repeat
    rng = random.Random(0)
    traces, t_make = timed(lambda: [make_trace(i, rng) for i in range(n)])
    # The fixture heap is long-lived; freezing it keeps the cyclic GC from re-scanning it during
    # every timed run, so the figures measure the per-row work of each format.
    gc.freeze()
    print(f"built {n:,} traces in {t_make:.1f} s ({len(traces[0].graph)} messages each)")

    with tempfile.TemporaryDirectory() as tmp:
        folder, jsonl = Path(tmp) / "traces", Path(tmp) / "traces.jsonl"
        # Warm up both paths (lazy imports, codec setup) so neither pays it inside the timing.
        write_parquet(traces[:100], Path(tmp) / "warm")
        table_to_traces(read_traces(Path(tmp) / "warm"))
        write_jsonl(traces[:100], Path(tmp) / "warm.jsonl")
        read_jsonl_traces(Path(tmp) / "warm.jsonl")
        # Each Parquet write run gets its own folder: TraceWriter appends, never overwrites.
        runs = iter(range(r))
        _, pq_write = timed(lambda: write_parquet(traces, folder / str(next(runs))), r)
        folder = folder / "0"
        _, js_write = timed(lambda: write_jsonl(traces, jsonl), r)
        # Keep only counts: holding every read-back copy would triple the memory used.
        rows = [0] * 4
        rows[0], pq_read_table = timed(lambda: read_traces(folder).num_rows, r)
        rows[1], pq_read_traces = timed(lambda: len(table_to_traces(read_traces(folder))), r)
        rows[2], js_read_dicts = timed(lambda: len(read_jsonl_dicts(jsonl)), r)
        rows[3], js_read_traces = timed(lambda: len(read_jsonl_traces(jsonl)), r)
        if rows != [n] * 4:
            raise RuntimeError(f"read back {rows} rows, expected {n} each")
        pq_mb, js_mb = size_mb(folder), size_mb(jsonl)

    def rate(seconds: float) -> str:
        return f"{n / seconds:>12,.0f} rows/s"

    print(f"{'':38}{'rows/s':>19}")
    print(f"{'write  parquet (TraceWriter)':38}{rate(pq_write)}")
    print(f"{'write  jsonl (json.dumps(model_dump))':38}{rate(js_write)}")
    print(f"{'read   parquet -> Arrow table':38}{rate(pq_read_table)}")
    print(f"{'read   parquet -> Trace objects':38}{rate(pq_read_traces)}")
    print(f"{'read   jsonl -> dicts (json.loads)':38}{rate(js_read_dicts)}")
    print(f"{'read   jsonl -> Trace objects':38}{rate(js_read_traces)}")
    print(f"size   parquet {pq_mb:.1f} MB   jsonl {js_mb:.1f} MB   ratio {js_mb / pq_mb:.2f}x")
    print(f"ratio  write   parquet/jsonl {js_write / pq_write:.2f}x")
    print(f"ratio  read    parquet table / jsonl dicts {js_read_dicts / pq_read_table:.2f}x")
    print(f"ratio  read    parquet traces / jsonl traces {js_read_traces / pq_read_traces:.2f}x")


if __name__ == "__main__":
    main()
