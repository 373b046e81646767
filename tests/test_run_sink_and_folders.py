"""The run folder's Ray-free parts: the sink's keyed appends (written once, reported durable
once, the header written once), finishing an episode into rows, resume reading them back, and
where run folders go."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import vfray as vf
from vfray.config import load_config
from vfray.errors import ConfigError
from vfray.run.folders import run_folder, run_header
from vfray.run.outcomes import EpisodeJob, EpisodeSpec, finish_episode
from vfray.run.results import RunResult
from vfray.run.resume import load_resume_state
from vfray.run.sink import TraceSink
from vfray.trace import RewardRecord, StopCondition, Trace
from vfray.traces.wire import pack_rows


class Pair(vf.Task[vf.TaskData]):
    @vf.group_reward
    def first(self, traces: list[Trace]) -> list[float]:
        return [1.0 if t.rollout_index == 0 else 0.0 for t in traces]


def rollout(task: Pair, index: int, ok: bool = True, attempt: int = 0) -> Trace:
    trace = Trace(task=task.record(), rollout_index=index, attempt=attempt, run_id="r")
    if ok:
        trace.rewards["one"] = RewardRecord(value=1.0)
        trace.stop(StopCondition.COMPLETED)
    else:
        trace.add_error(vf.SandboxError("box died"), "boot")
        trace.stop(StopCondition.ERROR)
    return trace


async def finish(sink: TraceSink, task: Pair, episode_id: str, new: list[Trace]) -> list[str]:
    job = EpisodeJob(task=task, episode_id=episode_id, spec=EpisodeSpec(run_id="r"))
    outcome, rows = await finish_episode(job, new)
    assert outcome.task_key == task.key and len(outcome.rollouts) == len(new)
    return await sink.append_rows(pack_rows(rows), episode_id)


async def test_keyed_appends_are_written_once_and_reported_durable_once(tmp_path: Path) -> None:
    sink = TraceSink(str(tmp_path), {"run_id": "r"}, flush_rows=1000, flush_seconds=3600)
    task = Pair(vf.TaskData(prompt="p"))
    traces = [rollout(task, 0), rollout(task, 1)]
    assert await finish(sink, task, "ep", traces) == []  # buffered, not yet on disk
    assert await finish(sink, task, "ep", traces) == []  # the same key again: skipped
    assert await sink.flush() == ["ep"]
    assert await sink.flush() == []  # reported once
    assert await sink.close() == 2
    result = RunResult(tmp_path)
    assert result.traces.num_rows == 2 and result.episodes.num_rows == 1
    assert result.episodes.column("rewards").to_pylist() == [[2.0, 1.0]]
    # The header is written once; a resumed run's sink keeps it.
    TraceSink(str(tmp_path), {"run_id": "other"})
    assert json.loads((tmp_path / "config.json").read_text()) == {"run_id": "r"}


async def test_resume_reads_back_what_the_sink_wrote(tmp_path: Path) -> None:
    sink = TraceSink(str(tmp_path), {"run_id": "r"}, flush_seconds=3600)
    whole, broken = Pair(vf.TaskData(prompt="a")), Pair(vf.TaskData(prompt="b"))
    await finish(sink, whole, "ep-a", [rollout(whole, 0), rollout(whole, 1)])
    await finish(sink, broken, "ep-b", [rollout(broken, 0), rollout(broken, 1, ok=False)])
    await sink.close()
    states = load_resume_state(tmp_path)
    assert set(states[whole.key].done) == {0, 1} and not states[whole.key].rescore
    assert states[whole.key].next_attempt == {0: 1, 1: 1}
    assert set(states[broken.key].done) == {0}  # the errored rollout is run again
    assert states[broken.key].episode_id == "ep-b"
    # The group's episode row covered the failed rollout: once re-run it is scored again.
    assert states[broken.key].rescore


def test_a_new_run_gets_a_named_empty_folder_and_a_resumed_one_keeps_its_own(
    tmp_path: Path,
) -> None:
    config = load_config(overrides={"output_dir": str(tmp_path), "env.harness.id": "null"})
    run_dir, run_id = run_folder(config, "my tasks", None)
    assert run_dir.parent.name == "my_tasks--scripted_arithmetic--null"
    assert run_dir.name == run_id and not run_dir.exists()
    header = run_header(config, run_id, "my tasks", 4)
    assert header["rollouts_per_task"] == 4 and header["config"]["env"]["harness"]["id"] == "null"
    assert set(header["versions"]) == {"vfray", "ray", "python"}
    run_dir.mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps(header))
    assert run_folder(config, "ignored", run_dir) == (run_dir, run_id)
    with pytest.raises(ConfigError, match=r"has no config\.json"):
        run_folder(config, "x", tmp_path)
