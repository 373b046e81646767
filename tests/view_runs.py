"""Run folders for the viewer's tests, written with vfray's own writers: traces recorded the
way the interception records them (``Trace.record_call``: branches, tool calls, reasoning,
token ids), a config.json header and an episodes table; plus a real run by the scripted model."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa

import vfray as vf
from vfray.trace import (
    AgentArtifact,
    AgentInfo,
    ErrorInfo,
    Message,
    PhaseTiming,
    RewardRecord,
    StopCondition,
    TaskRecord,
    Usage,
)
from vfray.traces.episodes import EPISODE_SCHEMA
from vfray.traces.io import traces_to_table, write_traces

T0 = 1_790_000_000.0


def make_trace(task: int, rollout: int, *, run_id: str = "run-synthetic") -> vf.Trace:
    """A bash-harness-like rollout: a tool call with reasoning, its result, then the answer;
    every fourth task's rollout 1 fails in setup, and task 2 compacts its history (2 branches)."""
    key = f"task-{task:04d}"
    trace = vf.Trace(
        run_id=run_id,
        episode_id=f"ep-{task}",
        rollout_index=rollout,
        task=TaskRecord(key=key, hash=f"h{task}", data={"prompt": f"What is {task} + {task}?"}),
        agent=AgentInfo(harness="bash", runtime="subprocess", model="scripted:bash"),
        created_at=T0 + task,
    )
    start = T0 + task
    trace.timing = {
        "boot": PhaseTiming(start=start, end=start + 0.1),
        "setup": PhaseTiming(start=start + 0.1, end=start + 0.2),
    }
    if task % 4 == 0 and rollout == 1:
        trace.errors = [
            ErrorInfo(
                type="TaskError",
                message=f"fixture {key} is missing",
                phase="setup",
                detail="Traceback (most recent call last): ...",
            )
        ]
        trace.stop_condition = StopCondition.ERROR
        trace.rewards = {"correct": RewardRecord(value=None, error="not scored")}
        return trace
    system = Message(role="system", content="You are terse.")
    user = Message(role="user", content=f"What is {task} + {task}?")
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "bash", "arguments": json.dumps({"command": f"expr {task} + {task}"})},
    }
    first = Message(role="assistant", content=None, tool_calls=[call], reasoning_content="use bash")
    result = Message(role="tool", tool_call_id="call_1", content=f"{2 * task}\n")
    answer = 2 * task + (rollout % 2)  # odd rollouts are wrong
    final = Message(role="assistant", content=f"The answer is {answer}.")
    common: dict[str, Any] = {"model": "scripted:bash", "streamed": False}
    trace.record_call(
        [system, user],
        first,
        usage=Usage(input_tokens=20, output_tokens=8),
        started_at=start + 0.2,
        ended_at=start + 0.3,
        finish_reason="tool_calls",
        prompt_token_ids=[101, 102, 103],
        completion_token_ids=[7, 8],
        completion_logprobs=[-0.25, -0.5],
        **common,
    )
    history = [user, first, result] if task == 2 else [system, user, first, result]
    trace.record_call(
        history,
        final,
        usage=Usage(input_tokens=30, output_tokens=6),
        started_at=start + 0.4,
        ended_at=start + 0.5,
        finish_reason="stop",
        **common,
    )
    trace.timing["agent"] = PhaseTiming(start=start + 0.2, end=start + 0.6)
    trace.stop_condition = StopCondition.COMPLETED
    trace.rewards = {"correct": RewardRecord(value=float(answer == 2 * task))}
    trace.metrics = {"reply_chars": float(len(final.text))}
    trace.artifacts = [AgentArtifact(name="trajectory.json", content='{"steps": 2}')]
    return trace


def write_run(
    folder: Path, tasks: int = 6, rollouts: int = 2, *, newer_fields: bool = False
) -> Path:
    """A complete run folder; ``newer_fields`` adds what a later vfray might write (a ``lane``
    column, a ``lanes`` trace field, an unknown message field)."""
    traces = [make_trace(t, r) for t in range(tasks) for r in range(rollouts)]
    table = traces_to_table(traces)
    if newer_fields:
        table = _with_newer_fields(table)
    write_traces(table, folder / "traces")
    episodes = []
    for t in range(tasks):
        group = traces[t * rollouts : (t + 1) * rollouts]
        rewards = [x.reward for x in group]
        scored = [r for r in rewards if r is not None]
        mean = sum(scored) / len(scored) if scored else None
        episodes.append(
            {
                "schema_version": 1,
                "run_id": "run-synthetic",
                "episode_id": f"ep-{t}",
                "task_key": group[0].task.key,
                "task_hash": group[0].task.hash,
                "n": rollouts,
                "trace_ids": [x.trace_id for x in group],
                "rollout_indices": [x.rollout_index for x in group],
                "rewards": rewards,
                "advantages": [None if r is None else r - (mean or 0.0) for r in rewards],
                "group_rewards": [{"key": "brevity_rank", "values": [1.0] * rollouts}],
                "mean_reward": mean,
                "pass_at_1": mean,
                "pass_at_n": float(any(scored)),
                "num_ok": sum(1 for x in group if x.ok),
                "created_at": T0 + t,
            }
        )
    (folder / "episodes").mkdir(parents=True)
    write_traces(pa.Table.from_pylist(episodes, schema=EPISODE_SCHEMA), folder / "episodes")
    header = {
        "run_id": "run-synthetic",
        "taskset": "sums",
        "rollouts_per_task": rollouts,
        "config": {
            "model": {"name": "scripted:bash"},
            "env": {"harness": {"id": "bash"}, "runtime": {"type": "subprocess"}},
        },
        "versions": {"vfray": vf.__version__, "python": sys.version.split()[0]},
        "created": "2026-12-01T00:00:00+00:00",
    }
    (folder / "config.json").write_text(json.dumps(header))
    return folder


def _with_newer_fields(table: pa.Table) -> pa.Table:
    texts = []
    for text in table.column("trace_json").to_pylist():
        data = json.loads(text)
        data["lanes"] = [{"lane": "red-team", "model": "judge-mini"}]
        for message in data["graph"].values():
            if message["role"] == "user":
                message["segment"] = "user-sim-1"
        texts.append(json.dumps(data))
    index = table.column_names.index("trace_json")
    table = table.set_column(index, "trace_json", pa.array(texts, pa.large_string()))
    lanes = [f"lane-{i % 2}" for i in range(table.num_rows)]
    return table.append_column("lane", pa.array(lanes, pa.string()))


def listing(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``folder`` with its size and mtime (to show nothing was written)."""
    return {
        str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
    }
