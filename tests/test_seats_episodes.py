"""A multi-agent episode's group figures are per seat: ``@vf.group_reward`` hooks see one seat's
traces at a time, and the episode row carries each seat's mean reward, pass@k and ok count next
to the pooled ones (local farm backend, the scripted model); episode files from before read."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

import vfray as vf
from vfray._plugins import load_object
from vfray.run.results import RunResult
from vfray.trace import RewardRecord
from vfray.traces.episodes import EPISODE_SCHEMA
from vfray.traces.io import read_parquet

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SumDuels = load_object(f"{EXAMPLES}/sum_duel.py:SumDuels")
SumDuel = vars(sys.modules[SumDuels.__module__])["SumDuel"]
WRONG = "scripted:arithmetic?accuracy=0"


class GroupedDuel(SumDuel):  # type: ignore[misc,valid-type]
    @vf.group_reward(weight=0.0)
    def group_seats(self, traces: list[vf.Trace]) -> list[float]:
        """How many seats the group holds: 1 when each seat is its own group."""
        return [float(len({t.seat for t in traces}))] * len(traces)


class GroupedDuels(SumDuels):  # type: ignore[misc,valid-type]
    def load(self) -> Any:
        for task in super().load():
            yield GroupedDuel(task.data, self.models)


def _run(tmp_path: Path) -> RunResult:
    with vf.Farm(
        "scripted:arithmetic",
        harness="null",
        backend="local",
        output_dir=str(tmp_path),
        progress=False,
    ) as farm:
        result: RunResult = farm.run(
            GroupedDuels(n=1, rounds=2, models={"bob": WRONG}), rollouts_per_task=2
        )
    return result


def test_group_rewards_and_episode_figures_are_per_seat(tmp_path: Path) -> None:
    result = _run(tmp_path)
    (row,) = pq.read_table(result.run_dir / "episodes").to_pylist()
    # Each seat's traces were their own group: the hook saw one seat at a time.
    assert row["group_rewards"] == [{"key": "group_seats", "values": [1.0] * 4}]
    # Alice won both games, bob lost both: per seat, nothing is pooled.
    assert row["seats"] == [
        {"seat": "alice", "n": 2, "mean_reward": 1.0, "pass_at_1": 1.0, "pass_at_n": 1.0,
         "num_ok": 2},
        {"seat": "bob", "n": 2, "mean_reward": 0.0, "pass_at_1": 0.0, "pass_at_n": 0.0,
         "num_ok": 2},
    ]  # fmt: skip
    assert row["mean_reward"] == 0.5 and row["n"] == 4  # the pooled figures, as before
    # pass@k over seats x rollouts would read "pass@4": it is per seat only.
    assert row["pass_at_1"] is None and row["pass_at_n"] is None
    summary = result.summary()
    assert {k: v for k, v in summary.items() if k.startswith("pass@")} == {
        "pass@1 (seat alice)": 1.0,
        "pass@2 (seat alice)": 1.0,
        "pass@1 (seat bob)": 0.0,
        "pass@2 (seat bob)": 0.0,
    }


def test_an_errored_rollout_never_passes_whatever_its_reward() -> None:
    task = vf.Task(vf.TaskData(prompt="hi"))
    traces = []
    for index in range(3):
        trace = vf.Trace(task=task.record(), rollout_index=index)
        trace.rewards["solved"] = RewardRecord(value=1.0)
        traces.append(trace)
    traces[0].add_error(vf.HarnessError("the agent crashed after writing the file"), "agent")
    traces[1].add_error(vf.HarnessError("so did this one"), "agent")
    episode = vf.Episode(task=task.record(), traces=traces)
    assert episode.rewards == [1.0, 1.0, 1.0]  # the rewards stay as scored
    assert episode.pass_at_k(1) == pytest.approx(1 / 3)  # was 1.0: all three counted
    assert episode.pass_at_k(2) == pytest.approx(2 / 3)


def test_episode_rows_without_seats_read_as_before(tmp_path: Path) -> None:
    solo = vf.Task(vf.TaskData(prompt="hi"))
    episode = vf.Episode(task=solo.record(), traces=[vf.Trace(task=solo.record())])
    assert episode.seat_figures() == []
    from vfray.traces.episodes import episodes_to_table

    table = episodes_to_table([episode])
    assert table.column("seats").to_pylist() == [None]
    # A run written before the column existed still reads, with no seat figures.
    pq.write_table(table.drop_columns(["seats"]), tmp_path / "part-0.parquet")
    old = read_parquet(tmp_path, EPISODE_SCHEMA)
    assert old.column("seats").to_pylist() == [None]
    assert old.column("n").to_pylist() == [1]
