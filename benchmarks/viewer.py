"""``vfray view`` on a large run: seconds to serve each page of a 10,000-rollout run folder
(multi-turn traces written with vfray's own writers, a part per 1,000 rows as a run leaves
them, then compacted), cold (a new app) and warm, plus the ``vfray view`` command from start
to its first page.

Run: ``python benchmarks/viewer.py [--rollouts 10000] [--turns 8] [--repeat 3]``.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pyarrow as pa

from vfray.endpoints.serving import serve_in_thread
from vfray.trace import (
    AgentInfo,
    ErrorInfo,
    Message,
    PhaseTiming,
    RewardRecord,
    StopCondition,
    TaskRecord,
    Trace,
    Usage,
)
from vfray.traces import TraceWriter, traces_to_table
from vfray.traces.episodes import EPISODE_SCHEMA
from vfray.traces.io import compact_parts, write_traces
from vfray.view import create_app

GROUP = 8
SYSTEM = Message(role="system", content="You are a careful agent. Use the bash tool. " * 8)


def make_trace(i: int, turns: int, rng: random.Random) -> Trace:
    """An agent rollout of ``turns`` tool calls and results, then an answer."""
    task = i // GROUP
    trace = Trace(
        task=TaskRecord(key=f"task-{task}", hash=f"{task:064x}", data={"prompt": f"fix #{task}"}),
        run_id="bench",
        episode_id=f"ep-{task}",
        rollout_index=i % GROUP,
        agent=AgentInfo(harness="bash", runtime="subprocess", model="small"),
    )
    history = [SYSTEM, Message(role="user", content=f"Fix issue #{task} in the repository.")]
    t0 = 1_790_000_000.0 + i
    for turn in range(turns):
        call = {
            "id": f"c{turn}",
            "type": "function",
            "function": {"name": "bash", "arguments": json.dumps({"cmd": f"grep -n x f{turn}.py"})},
        }
        reply = Message(role="assistant", content=f"Step {turn}: look.", tool_calls=[call])
        trace.record_call(
            history,
            reply,
            model="small",
            usage=Usage(input_tokens=200 + 150 * turn, output_tokens=30),
            started_at=t0 + turn,
            ended_at=t0 + turn + 0.5,
            finish_reason="tool_calls",
        )
        result = Message(
            role="tool", tool_call_id=f"c{turn}", content=f"f{turn}.py:{i}: x = {turn}\n" * 6
        )
        history = [*history, reply, result]
    trace.record_call(history, Message(role="assistant", content="Done."), model="small",
                      usage=Usage(input_tokens=1500, output_tokens=10), started_at=t0 + turns,
                      ended_at=t0 + turns + 0.3, finish_reason="stop")  # fmt: skip
    if rng.random() < 0.05:
        trace.errors.append(ErrorInfo(type="SandboxError", message="box died", phase="agent"))
        trace.stop_condition = StopCondition.ERROR
    else:
        trace.stop_condition = StopCondition.COMPLETED
    trace.rewards["correct"] = RewardRecord(value=float(rng.random() < 0.4))
    trace.metrics["tool_calls"] = float(turns)
    for k, phase in enumerate(("boot", "setup", "agent", "finalize", "scoring", "teardown")):
        trace.timing[phase] = PhaseTiming(start=t0 + k, end=t0 + k + 0.3)
    return trace


def write_run(folder: Path, rollouts: int, turns: int) -> None:
    rng = random.Random(0)
    episodes = []
    with TraceWriter(folder / "traces", flush_rows=1000) as writer:
        for start in range(0, rollouts, 1000):
            batch = [make_trace(i, turns, rng) for i in range(start, min(rollouts, start + 1000))]
            writer.write(traces_to_table(batch))
            for g in range(0, len(batch), GROUP):
                group = batch[g : g + GROUP]
                rewards = [t.reward for t in group]
                episodes.append({
                    "schema_version": 1, "episode_id": group[0].episode_id,
                    "task_key": group[0].task.key, "task_hash": group[0].task.hash,
                    "n": len(group), "rewards": rewards, "mean_reward": sum(rewards) / len(group),
                    "pass_at_1": sum(rewards) / len(group), "pass_at_n": float(any(rewards)),
                    "created_at": 0.0,
                })  # fmt: skip
    write_traces(pa.Table.from_pylist(episodes, schema=EPISODE_SCHEMA), folder / "episodes")
    header = {"run_id": "bench", "taskset": "bench", "rollouts_per_task": GROUP, "config": {}}
    (folder / "config.json").write_text(json.dumps(header))


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def get(client: httpx.Client, path: str) -> str:
    reply = client.get(path, timeout=120)
    reply.raise_for_status()
    return reply.text


def pages(run: Path, label: str, repeat: int) -> None:
    best: dict[str, float] = {}
    for _ in range(repeat):
        with serve_in_thread(create_app([run])) as url, httpx.Client(base_url=url) as c:
            steps: list[tuple[str, Callable[[], object]]] = [
                ("summary, cold (new app: reads every part)", lambda: get(c, "/run/0")),
                ("summary, warm", lambda: get(c, "/run/0")),
                ("rollout list (first 100)", lambda: get(c, "/run/0/rollouts")),
                (
                    "list: errored, sorted by reward",
                    lambda: get(c, "/run/0/rollouts?status=error&sort=reward&dir=desc"),
                ),
                (
                    "list: search transcripts, first",
                    lambda: get(c, "/run/0/rollouts?q=x%20%3D%207"),
                ),
                ("list: search transcripts, again", lambda: get(c, "/run/0/rollouts?q=f3.py")),
            ]
            link = ""
            for name, step in steps:
                best[name] = min(best.get(name, math.inf), timed(step))
            link = re.findall(r"href='(/run/0/rollout/[0-9a-f]+)'", get(c, "/run/0/rollouts"))[0]
            for name, path in [
                ("one rollout page", link),
                ("episode (8 side by side)", "/run/0/episode?task=task-7"),
                ("tasks list", "/run/0/episodes"),
            ]:
                best[name] = min(best.get(name, math.inf), timed(lambda p=path: get(c, p)))
    print(f"\n{label}")
    for name, seconds in best.items():
        print(f"  {name:<45} {seconds:7.3f} s")


def command(run: Path) -> float:
    start = time.perf_counter()
    argv = [sys.executable, "-m", "vfray.cli.main", "view", str(run), "--port", "0"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        url = re.search(r"http://\S+/", proc.stdout.readline())
        assert url is not None
        httpx.get(url.group(0) + "run/0", timeout=120).raise_for_status()
        return time.perf_counter() - start
    finally:
        proc.terminate()
        proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rollouts", type=int, default=10_000)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--keep", type=Path, help="also copy the run folder written here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        start = time.perf_counter()
        write_run(run, args.rollouts, args.turns)
        if args.keep:
            shutil.copytree(run, args.keep, dirs_exist_ok=True)
        size = sum(p.stat().st_size for p in run.rglob("*.parquet")) / 2**20
        print(f"{args.rollouts:,} rollouts of {args.turns} tool turns, {size:.0f} MiB of Parquet, "
              f"written in {time.perf_counter() - start:.1f} s")  # fmt: skip
        pages(run, "parts as a run leaves them (one per 1,000 rows)", args.repeat)
        compact_parts(run / "traces")
        pages(run, "after compaction (one part)", args.repeat)
        took = min(command(run) for _ in range(args.repeat))
        print(f"\n`vfray view RUN` from start to its first page served: {took:.2f} s")


if __name__ == "__main__":
    main()
