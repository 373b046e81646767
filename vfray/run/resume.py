"""Resume: what an earlier run folder already holds, per task, so a rerun submits only the
missing or errored rollouts with fresh attempt numbers, writes nothing twice, and rebuilds the
episode rows a crash lost (groups whose traces are all there but whose episode row is not)."""

from __future__ import annotations

import uuid
from pathlib import Path

from vfray.run.plan import ResumeState
from vfray.run.results import RunResult, final_rows
from vfray.trace import Trace
from vfray.traces.convert import table_to_traces
from vfray.traces.parts import finish_compaction


def tidy_run_folder(run_dir: Path) -> None:
    """Finish a compaction that died in an earlier run (its temporary file, replaced parts)."""
    for table in ("traces", "episodes"):
        finish_compaction(run_dir / table)


def load_resume_state(run_dir: Path) -> dict[str, ResumeState]:
    """Per task key: the rollouts that already succeeded, the next attempt numbers, and
    whether the group's episode row must be (re)built."""
    tidy_run_folder(run_dir)
    folder = run_dir / "traces"
    if not folder.exists():
        return {}
    result = RunResult(run_dir)
    table = result.traces
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
    games: dict[tuple[str, int], list[Trace]] = {}
    for trace in table_to_traces(final_rows(table)):
        state = states.setdefault(trace.task.key, ResumeState(episode_id=trace.episode_id or ""))
        if trace.seat is not None:
            games.setdefault((trace.task.key, trace.rollout_index), []).append(trace)
        elif trace.ok:
            state.done[trace.rollout_index] = trace
    for (key, index), game in games.items():
        if all(t.ok for t in game):  # a game is played again whole, or not at all
            states[key].games[index] = game
    for (key, index), attempt in attempts.items():
        state = states.setdefault(key, ResumeState(episode_id=uuid.uuid4().hex))
        state.next_attempt[index] = attempt + 1
    episodes = result.episodes
    scored = {
        key: set(ids or [])
        for key, ids in zip(
            episodes.column("task_key").to_pylist(),
            episodes.column("trace_ids").to_pylist(),
            strict=True,
        )
    }
    for key, state in states.items():
        if not state.episode_id:
            state.episode_id = uuid.uuid4().hex
        # The current episode row must be over exactly the traces that are now final: a crash
        # between the trace and the episode flush leaves none, or the pre-resume one.
        current = {t.trace_id for t in state.finished()}
        state.rescore = scored.get(key) != current
    return states
