"""Several agents in one episode (``vf.SeatedTask``): each seat its own rollout, trace, model and
reward; proposer/solver in sequence, a two-player game taking turns, a judge working in another
seat's box; a seat whose harness crashes; on the local backend (subprocess, bwrap) and on Ray,
with the scripted model and the real interception."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from docker_engine import box_options

import vfray as vf
from vfray._plugins import load_object
from vfray.errors import ConfigError
from vfray.harnesses.seats import Game, check_seats
from vfray.rollout import Timeouts
from vfray.run.environment import LocalEnvironment, run_game
from vfray.traces import read_traces, to_samples

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
# Loaded by file path, the way ``vfray eval examples/x.py:Class`` loads them.
SumDuels = load_object(f"{EXAMPLES}/sum_duel.py:SumDuels")
SumDuel = vars(sys.modules[SumDuels.__module__])["SumDuel"]
ProposerSolver = load_object(f"{EXAMPLES}/proposer_solver.py:ProposerSolver")
ProposeSolve = vars(sys.modules[ProposerSolver.__module__])["ProposeSolve"]

WRONG = "scripted:arithmetic?accuracy=0"
HAS_BWRAP = shutil.which("bwrap") is not None


def _duel(models: dict[str, str] | None = None, rounds: int = 4) -> vf.SeatedTask[Any]:
    return next(iter(SumDuels(n=1, rounds=rounds, models=models).load()))


def _user_texts(trace: vf.Trace) -> list[str]:
    return [m.text for m in trace.messages if m.role == "user"]


def _children() -> set[int]:
    """Live processes whose parent is this test process (but the box owner's one watchdog,
    which lives as long as the process, by design: ``vfray/runtimes/lifeline.py``)."""
    me, out = os.getpid(), set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me and fields[0] != "Z":
            with contextlib.suppress(OSError):
                if b"_reap" in (entry / "cmdline").read_bytes():
                    continue
            out.add(int(entry.name))
    return out


async def test_two_player_game_takes_turns_with_a_model_per_seat() -> None:
    traces = await run_game(_duel({"bob": WRONG}), model="scripted:arithmetic", harness="null")
    alice, bob = traces
    assert (alice.seat, bob.seat) == ("alice", "bob")
    assert (alice.agent.name, alice.agent.model) == ("alice", "scripted:arithmetic")
    assert (bob.agent.name, bob.agent.model) == ("bob", WRONG)
    # Alice answered round 1 right; bob's round-2 question builds on her answer, and he erred.
    assert _user_texts(alice) == ["What is 0 + 1?"]
    assert _user_texts(bob) == ["What is 1 + 4?"]
    assert alice.last_reply == "1" and bob.last_reply != "5"
    assert alice.reward == 1.0 and bob.reward == 0.0
    assert alice.ok and bob.ok
    # Each seat's calls are in its own trace only.
    assert len(alice.calls) == 1 and len(bob.calls) == 1


async def test_a_seat_plays_several_turns_as_segments_of_one_rollout() -> None:
    alice, bob = await run_game(_duel(), model="scripted:arithmetic", harness="null")
    # Four rounds, alternating: each seat two turns, each turn one segment of its rollout.
    assert _user_texts(alice) == ["What is 0 + 1?", "What is 5 + 7?"]
    assert _user_texts(bob) == ["What is 1 + 4?", "What is 12 + 10?"]
    assert len(alice.segments) == 2 and len(bob.segments) == 2
    assert alice.reward == bob.reward == 0.5  # a draw


async def test_the_solver_sees_the_proposers_output() -> None:
    task = ProposeSolve(ProposerSolver(n=1).load().__next__().data, proposer_model="scripted:echo")
    proposer, solver = await run_game(task, model="scripted:arithmetic", harness="null")
    assert proposer.agent.model == "scripted:echo" and solver.agent.model == "scripted:arithmetic"
    assert proposer.messages[0].role == "system"  # the seat's own system prompt
    assert _user_texts(solver) == [proposer.last_reply]
    assert solver.last_reply == "17"
    assert proposer.reward == solver.reward == 1.0
    # Both keep the task's identity (the prompt-less copy each seat plays is not a new task).
    assert proposer.task == solver.task == task.record()


class Inspect(vf.SeatedTask[vf.TaskData]):
    """A worker writes a file; a judge working in the worker's box reads it."""

    def seats(self) -> Sequence[vf.Seat]:
        return [vf.Seat(name="worker"), vf.Seat(name="judge", box="worker")]

    def next_turn(self, game: Game) -> vf.Turn | None:
        if not game.plays:
            return vf.Turn(seat="worker", message="run: `echo 42 > answer.txt && pwd`")
        if len(game.plays) == 1:
            return vf.Turn(seat="judge", message="run: `cat answer.txt`")
        return None

    @vf.reward
    async def found(self, runtime: vf.Runtime) -> bool:
        # Scored per seat with the box still up: both seats see the same file.
        return (await runtime.read("answer.txt")).strip() == b"42"


RUNTIMES = [
    "subprocess",
    pytest.param("bwrap", marks=pytest.mark.skipif(not HAS_BWRAP, reason="no bwrap")),
    "docker",
]


def _containers(options: dict[str, Any]) -> set[str]:
    """Every vfray container on the test's docker engine, running or not (none without one)."""
    if not options:
        return set()
    from vfray.runtimes import _reap

    return {str(c["Id"]) for c in _reap._containers(options["base_url"], _reap.OWNER_LABEL)}


JUDGE_MODEL = "scripted:bash?latency=0"


class OwnJudge(Inspect):
    """The judge talks to a model endpoint of its own (another interception) from the worker's
    box: the box reaches both."""

    def seats(self) -> Sequence[vf.Seat]:
        judge = vf.Agent(name="judge", model=JUDGE_MODEL)
        return [vf.Seat(name="worker"), vf.Seat(name="judge", box="worker", agent=judge)]


@pytest.mark.parametrize("task", [Inspect, OwnJudge], ids=["one-endpoint", "own-endpoints"])
@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_a_judge_works_in_another_seats_box_which_is_stopped_once(
    runtime: str, task: type[Inspect], request: pytest.FixtureRequest
) -> None:
    options = box_options(runtime, request)
    before = _containers(options)
    worker, judge = await run_game(
        task(vf.TaskData()),
        model="scripted:bash",
        harness="bash",
        runtime=runtime,
        runtime_options=options,
    )
    assert judge.last_reply is not None and judge.last_reply.strip() == "42"
    assert worker.reward == judge.reward == 1.0
    assert worker.ok and judge.ok, (worker.errors, judge.errors)
    assert len(worker.calls) == len(judge.calls) == 2
    if task is OwnJudge:  # each seat's calls went to its own model, through its interception
        assert {c.model for c in judge.calls} == {JUDGE_MODEL}
        assert {c.model for c in worker.calls} == {"scripted:bash"}
    if runtime == "subprocess":  # the box is a host dir: gone once both seats were done
        box = Path((worker.last_reply or "").strip())
        assert box.is_absolute() and not box.exists()
    assert _containers(options) == before  # the one shared container is gone too


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_a_seat_whose_harness_crashes_fails_alone_and_leaves_no_process(
    runtime: str, request: pytest.FixtureRequest
) -> None:
    class Crashing(SumDuel):  # type: ignore[misc,valid-type]
        def seats(self) -> Sequence[vf.Seat]:
            crash = vf.Agent(name="broken", harness="null", harness_options={"python": "false"})
            return [vf.Seat(name="alice"), vf.Seat(name="bob", agent=crash)]

    options = box_options(runtime, request)
    before, containers = _children(), _containers(options)
    task = Crashing(_duel().data)
    async with LocalEnvironment(
        model="scripted:arithmetic", harness="null", runtime=runtime, runtime_options=options
    ) as env:
        alice, bob = await env.game(task)
    err = bob.error()
    assert err is not None and err.type == "HarnessError" and err.phase == "agent"
    assert bob.stop_condition == vf.StopCondition.ERROR
    assert not bob.calls
    # Alice's turn and its data are kept, and she wins by her opponent's failure.
    assert alice.ok and alice.last_reply == "1" and alice.reward == 1.0
    assert bob.reward == 0.0
    assert _children() <= before  # the boxes' programs are gone
    assert _containers(options) == containers


class Misplayed(SumDuel):  # type: ignore[misc,valid-type]
    def next_turn(self, game: Game) -> vf.Turn | None:
        if not game.plays:
            return vf.Turn(seat="alice", message="What is 1 + 1?")
        return vf.Turn(seat="carol", message="What is 2 + 2?")


async def test_a_turn_for_an_unknown_seat_is_a_task_error_on_the_seated_traces() -> None:
    (alice,) = await run_game(Misplayed(_duel().data), model="scripted:arithmetic", harness="null")
    err = alice.error()
    assert err is not None and err.type == "TaskError" and "carol" in err.message
    assert alice.last_reply == "2"  # the turn played before is kept


def test_seats_are_checked() -> None:
    with pytest.raises(ConfigError, match="unique"):
        check_seats([vf.Seat(name="a"), vf.Seat(name="a")])
    with pytest.raises(ConfigError, match="unknown seat"):
        check_seats([vf.Seat(name="a", box="b")])
    with pytest.raises(ConfigError, match="owns one"):
        check_seats([vf.Seat(name="a"), vf.Seat(name="b", box="a"), vf.Seat(name="c", box="b")])
    with pytest.raises(ConfigError, match="at least one"):
        check_seats([])


def _check_run_folder(run_dir: Path, tasks: int, games: int) -> None:
    table = read_traces(run_dir / "traces")
    assert table.num_rows == tasks * games * 2
    assert sorted(set(table.column("seat").to_pylist())) == ["alice", "bob"]
    rows = table.to_pylist()
    for row in rows:
        assert row["agent_name"] == row["seat"]
        assert row["model"] == ("scripted:arithmetic" if row["seat"] == "alice" else WRONG)
    # Advantages are per seat: every alice game was won, every bob game lost, so both zero.
    assert {row["advantage"] for row in rows} == {0.0}
    samples = to_samples(table, seat="bob")
    assert samples.num_rows == tasks * games
    assert set(samples.column("seat").to_pylist()) == {"bob"}
    assert set(samples.column("reward").to_pylist()) == {0.0}


def test_seated_tasks_run_on_the_local_farm_backend(tmp_path: Path) -> None:
    with vf.Farm(
        "scripted:arithmetic",
        harness="null",
        backend="local",
        output_dir=str(tmp_path),
        progress=False,
    ) as farm:
        result = farm.run(SumDuels(n=2, rounds=2, models={"bob": WRONG}), rollouts_per_task=2)
    _check_run_folder(result.run_dir, tasks=2, games=2)
    assert result.summary()["seats"] == {"alice": 1.0, "bob": 0.0}
    table = pq.read_table(result.run_dir / "episodes")
    assert table.num_rows == 2


def test_old_trace_files_without_seat_columns_still_read(tmp_path: Path) -> None:
    from vfray.traces import traces_to_table

    trace = vf.Trace(task=vf.Task(vf.TaskData(prompt="hi")).record())
    old = traces_to_table([trace]).drop_columns(["seat", "agent_name"])
    pq.write_table(old, tmp_path / "part-0.parquet")
    table = read_traces(tmp_path)
    assert table.column("seat").to_pylist() == [None]
    assert "seat" in to_samples(table).column_names


@pytest.mark.skipif(not HAS_BWRAP, reason="no bwrap")
async def test_proposer_and_solver_in_bwrap_boxes() -> None:
    task = ProposeSolve(ProposerSolver(n=1).load().__next__().data, proposer_model="scripted:echo")
    proposer, solver = await run_game(
        task, model="scripted:arithmetic", harness="null", runtime="bwrap"
    )
    assert proposer.agent.runtime == solver.agent.runtime == "bwrap"
    assert _user_texts(solver) == [proposer.last_reply]
    assert proposer.reward == solver.reward == 1.0


def test_seated_tasks_run_on_ray(ray_local: None, tmp_path: Path) -> None:
    with vf.Farm(
        "scripted:arithmetic",
        harness="null",
        output_dir=str(tmp_path),
        progress=False,
        hosts=1,
    ) as farm:
        result = farm.run(SumDuels(n=1, rounds=2, models={"bob": WRONG}), rollouts_per_task=2)
    _check_run_folder(result.run_dir, tasks=1, games=2)


def test_resume_plays_failed_games_again_whole_and_keeps_finished_ones(tmp_path: Path) -> None:
    class BrokenBob(SumDuel):  # type: ignore[misc,valid-type]
        def seats(self) -> Sequence[vf.Seat]:
            crash = vf.Agent(name="bob", harness="null", harness_options={"python": "false"})
            return [
                vf.Seat(name="alice", agent=vf.Agent(name="alice")),
                vf.Seat(name="bob", agent=crash),
            ]

    good = list(SumDuels(n=2, rounds=2).load())
    # Same data, so the same task keys: the first task's games crash, the second's are fine.
    first = [BrokenBob(good[0].data), good[1]]
    with vf.Farm(
        "scripted:arithmetic",
        harness="null",
        backend="local",
        output_dir=str(tmp_path),
        progress=False,
    ) as farm:
        run = farm.run(first, rollouts_per_task=2)
        before = read_traces(run.run_dir / "traces")
        assert before.num_rows == 8
        again = farm.run(good, rollouts_per_task=2, resume=run.run_dir)
    table = read_traces(again.run_dir / "traces")
    # Only the broken task's two games were played again (both seats each), as attempt 1.
    assert table.num_rows == 8 + 4
    final = again.final_traces.to_pylist()
    assert len(final) == 8
    assert all(row["ok"] for row in final)
    by_task = {(row["task_key"], row["attempt"]) for row in final}
    assert by_task == {(good[0].key, 1), (good[1].key, 0)}


async def test_a_seat_with_a_misconfigured_agent_fails_alone_as_data() -> None:
    class Unknown(SumDuel):  # type: ignore[misc,valid-type]
        def seats(self) -> Sequence[vf.Seat]:
            nope = vf.Agent(name="bob", harness="no-such-harness")
            return [vf.Seat(name="alice"), vf.Seat(name="bob", agent=nope)]

    alice, bob = await run_game(Unknown(_duel().data), model="scripted:arithmetic", harness="null")
    assert (bob.seat, bob.agent.harness) == ("bob", "no-such-harness")
    err = bob.error()
    assert err is not None and err.type == "ConfigError" and err.phase == "seating"
    assert "no-such-harness" in err.message
    assert alice.ok and alice.last_reply == "1" and alice.reward == 1.0


async def test_a_cancelled_game_tears_every_box_down() -> None:
    before = _children()
    # The model takes a minute to answer: the game is cancelled while alice's program waits.
    async with LocalEnvironment(model="scripted:arithmetic?latency=60", harness="null") as env:
        game = asyncio.ensure_future(env.game(_duel()))
        for _ in range(1200):  # until alice's harness program runs (its box is up)
            if _children() - before:
                break
            await asyncio.sleep(0.05)
        assert _children() - before
        game.cancel()
        with pytest.raises(asyncio.CancelledError):
            await game
        # A child caught between fork and exec (the box owner's helpers start that way) can
        # show for a moment after teardown (CI saw one once): a leaked box stays; it does not.
        for _ in range(100):
            if _children() <= before:
                break
            await asyncio.sleep(0.05)
        assert _children() <= before


async def test_a_next_turn_that_hangs_ends_the_game_after_the_user_deadline() -> None:
    class Hangs(SumDuel):  # type: ignore[misc,valid-type]
        async def next_turn(self, game: Game) -> vf.Turn | None:
            if not game.plays:
                return vf.Turn(seat="alice", message="What is 1 + 1?")
            await asyncio.Event().wait()
            return None

    async with LocalEnvironment(
        model="scripted:arithmetic", harness="null", timeouts=Timeouts(user=0.5)
    ) as env:
        (alice,) = await env.game(Hangs(_duel().data))
    err = alice.error()
    assert err is not None and err.type == "TaskError" and "within 0.5s" in err.message
    assert alice.last_reply == "2"


async def test_the_policy_version_is_stamped_on_every_seats_calls() -> None:
    async with LocalEnvironment(model="scripted:arithmetic", harness="null") as env:
        env.set_policy_version(3)
        alice, bob = await env.game(_duel({"bob": WRONG}, rounds=2))
        env.set_policy_version(4)
        again = await env.game(_duel({"bob": WRONG}, rounds=2))
    assert [c.policy_version for t in (alice, bob) for c in t.calls] == [3, 3]
    assert [c.policy_version for t in again for c in t.calls] == [4, 4]
