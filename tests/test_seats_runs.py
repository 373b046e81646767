"""A seat run more than once in one game (``vf.Seat(runs=2)``, ``vf.Turn(run=2)``): each run its
own rollout and trace (``solver``, ``solver#2``), pooled per seat in the episode's figures and
advantages, all kept in the run folder; a ``trainable=False`` seat gets no advantage. On the
local farm backend with the scripted model and the real interception."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import ClassVar

import pyarrow.parquet as pq
import pytest

import vfray as vf
from vfray.harnesses.seats import Ask, Game
from vfray.run.environment import run_game
from vfray.run.results import RunResult
from vfray.traces import read_traces, to_samples

QUESTIONS = ("What is 2 + 3?", "What is 2 + 4?")


class TwoSolvers(vf.SeatedTask[vf.TaskData]):
    """A (non-trainable) proposer asks; two runs of one solver seat answer one question each;
    only the answer 5 scores."""

    def seats(self) -> Sequence[vf.Seat]:
        return [vf.Seat(name="proposer", trainable=False), vf.Seat(name="solver", runs=2)]

    def next_turn(self, game: Game) -> vf.Turn | None:
        i = len(game.plays)
        if i == 0:
            return vf.Turn(seat="proposer", message="What is 1 + 1?")
        if i <= len(QUESTIONS):
            return vf.Turn(seat="solver", message=QUESTIONS[i - 1], run=i)
        return None

    @vf.reward
    def five(self, trace: vf.Trace) -> float:
        return float(trace.last_reply == "5")


class Tasks(vf.Taskset[TwoSolvers]):
    def load(self) -> list[TwoSolvers]:
        return [TwoSolvers(vf.TaskData(idx=0))]


class TooMany(TwoSolvers):
    def next_turn(self, game: Game) -> vf.Turn | None:
        return vf.Turn(seat="proposer", message="What is 1 + 1?", run=2) if not game.plays else None


async def test_each_run_of_a_seat_is_its_own_rollout_and_trace() -> None:
    proposer, solver, solver2 = await run_game(
        TwoSolvers(vf.TaskData()), model="scripted:arithmetic", harness="null"
    )
    assert [t.seat for t in (proposer, solver, solver2)] == ["proposer", "solver", "solver#2"]
    assert [t.agent.name for t in (proposer, solver, solver2)] == [None, None, None]
    # Each run heard only its own turn, in a rollout of its own.
    assert [m.text for m in solver.messages if m.role == "user"] == [QUESTIONS[0]]
    assert [m.text for m in solver2.messages if m.role == "user"] == [QUESTIONS[1]]
    assert (solver.last_reply, solver2.last_reply) == ("5", "6")
    assert (solver.reward, solver2.reward) == (1.0, 0.0)
    assert len({proposer.trace_id, solver.trace_id, solver2.trace_id}) == 3
    assert not proposer.agent.trainable and solver.agent.trainable and solver2.agent.trainable


async def test_a_run_past_the_seats_runs_ends_the_game_in_one_line() -> None:
    (trace,) = await run_game(TooMany(vf.TaskData()), model="scripted:arithmetic", harness="null")
    error = trace.error()
    assert error is not None and error.type == "TaskError" and "\n" not in error.message
    assert "run 2 of seat 'proposer', which declares runs=1" in error.message


class AtOnce(vf.SeatedTask[vf.TaskData]):
    """Both runs of the solver seat asked at once (``play`` with a gather, as a v1 env's
    TaskGroup): each run's setup waits for the other run's to start (up to 60 s), so it finds
    the other there only when the game seats the runs concurrently."""

    arrived: ClassVar[list[str]] = []
    met: ClassVar[dict[str, bool]] = {}

    def seats(self) -> Sequence[vf.Seat]:
        return [vf.Seat(name="solver", runs=2)]

    async def play(self, game: Game, ask: Ask) -> None:
        turns = [vf.Turn(seat="solver", message=q, run=i + 1) for i, q in enumerate(QUESTIONS)]
        assert await asyncio.gather(*map(ask, turns)) == ["5", "6"]

    async def setup(self, trace: vf.Trace, runtime: object) -> None:
        assert self.seat is not None
        AtOnce.arrived.append(self.seat)
        for _ in range(1200):  # not a timing assertion: a bound on waiting for the other run
            if len(AtOnce.arrived) == 2:
                break
            await asyncio.sleep(0.05)
        AtOnce.met[self.seat] = len(AtOnce.arrived) == 2


async def test_runs_a_task_asks_for_at_once_play_at_once() -> None:
    solver, solver2 = await run_game(
        AtOnce(vf.TaskData()), model="scripted:arithmetic", harness="null"
    )
    # Each run was set up while the other was too (one at a time, the first would wait alone).
    assert AtOnce.met == {"solver": True, "solver#2": True}
    assert [t.seat for t in (solver, solver2)] == ["solver", "solver#2"]
    assert (solver.last_reply, solver2.last_reply) == ("5", "6") and solver.ok and solver2.ok


class AsksTwice(vf.SeatedTask[vf.TaskData]):
    def seats(self) -> Sequence[vf.Seat]:
        return [vf.Seat(name="solver")]

    async def play(self, game: Game, ask: Ask) -> None:
        turn = vf.Turn(seat="solver", message=QUESTIONS[0])
        await asyncio.gather(ask(turn), ask(turn))


async def test_a_play_that_asks_one_run_twice_at_once_ends_in_one_line() -> None:
    # A run takes one turn at a time: the second ask fails the play, named, on the run's trace.
    (trace,) = await run_game(AsksTwice(vf.TaskData()), model="scripted:arithmetic", harness="null")
    error = trace.error()
    assert error is not None and error.type == "TaskError" and "\n" not in error.message
    assert (
        "play failed: ValueError: solver already has a turn in play (a run takes one at a time)"
        in error.message
    )


@pytest.fixture(scope="module")
def farm_run(tmp_path_factory: pytest.TempPathFactory) -> RunResult:
    out = tmp_path_factory.mktemp("runs")
    with vf.Farm(
        "scripted:arithmetic", harness="null", backend="local", output_dir=str(out), progress=False
    ) as farm:
        result: RunResult = farm.run(Tasks(), rollouts_per_task=1)
    return result


def test_a_seats_runs_are_kept_and_pooled_per_seat_on_the_farm(farm_run: RunResult) -> None:
    table = read_traces(farm_run.run_dir / "traces")
    rows = sorted(table.to_pylist(), key=lambda r: r["seat"])
    # Every run is a row of the final traces (none taken for an earlier attempt of another).
    assert [r["seat"] for r in farm_run.final_traces.to_pylist()].count("solver#2") == 1
    assert [r["seat"] for r in rows] == ["proposer", "solver", "solver#2"]
    # The solver's two runs are one group (one policy's samples): rewards 1 and 0 → ±0.5;
    # the proposer is not trainable: no advantage, no batch row.
    assert [r["advantage"] for r in rows] == [None, 0.5, -0.5]
    (episode,) = pq.read_table(farm_run.run_dir / "episodes").to_pylist()
    figures = {s["seat"]: (s["n"], s["mean_reward"]) for s in episode["seats"]}
    assert figures == {"proposer": (1, 0.0), "solver": (2, 0.5)}
    assert to_samples(table, seat="solver#2").num_rows == 1
    assert to_samples(table, seat="solver").column("seat").to_pylist() == ["solver", "solver#2"]
    # The run's summary: one mean per seat, its runs pooled.
    assert farm_run.summary()["seats"] == {"proposer": 0.0, "solver": 0.5}
