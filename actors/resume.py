"""Resume: what an earlier run folder already holds, per task, so a rerun submits only the
missing or errored rollouts with fresh attempt numbers and writes nothing twice."""

from __future__ import annotations

import uuid
from pathlib import Path

from vfray.driver import ResumeState
from vfray.results import RunResult, final_rows
from vfray.traces.convert import table_to_traces


def load_resume_state(run_dir: Path) -> dict[str, ResumeState]:
    """Per task key: the rollouts that already succeeded and the next attempt numbers."""
    folder = run_dir / "traces"
    if not folder.exists():
        return {}
    table = RunResult(run_dir).traces
    if table.num_rows == 0:
        return {}
    attempts: dict[tuple[str, int], int] = {}
    for key, index, attempt in zip(
        table.column("task_key").to_pylist(),
        table.column("rollout_index").to_pylist(),
        table.column("attempt").to_pylist(),
        strict=True,
    ):
        attempts[(key, index)] = max(attempts.get((key, index), -1), attempt)
    states: dict[str, ResumeState] = {}
    for trace in table_to_traces(final_rows(table)):
        state = states.setdefault(trace.task.key, ResumeState(episode_id=trace.episode_id or ""))
        if trace.ok:
            state.done[trace.rollout_index] = trace
    for (key, index), attempt in attempts.items():
        state = states.setdefault(key, ResumeState(episode_id=uuid.uuid4().hex))
        state.next_attempt[index] = attempt + 1
    for state in states.values():
        if not state.episode_id:
            state.episode_id = uuid.uuid4().hex
    return states
