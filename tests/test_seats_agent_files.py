"""Seats that share a box and run agent programs: every provisioned agent keeps its home and
transcript in the box's one fixed agent folder (``.vfray/agent``), so two rollouts of one box
running the same program would overwrite each other's (before the refusal, the owner's codex
transcript held only the borrower's events). Such a game is refused before any box starts;
different programs in one box keep their own files (real agents in bwrap, the scripted
``agent`` model)."""

from __future__ import annotations

import shutil
from collections.abc import Sequence

import pytest
from agent_tools import need_registry
from test_agents import _timed_install

import vfray as vf
from vfray.harnesses.base import Harness
from vfray.harnesses.registry import harness_class
from vfray.harnesses.seats import Game
from vfray.run.environment import run_game
from vfray.run.seat_refusals import shared_box_conflict

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="no bwrap")


class SharedBox(vf.SeatedTask[vf.TaskData]):
    """alice writes a.txt, then bob, in alice's box, writes b.txt; bob's harness is
    ``bob_harness`` (None: the run's)."""

    def __init__(self, data: vf.TaskData, bob_harness: str | None = None) -> None:
        super().__init__(data)
        self.bob_harness = bob_harness

    def seats(self) -> Sequence[vf.Seat]:
        bob = vf.Agent(harness=self.bob_harness)
        return [vf.Seat(name="alice"), vf.Seat(name="bob", agent=bob, box="alice")]

    def next_turn(self, game: Game) -> vf.Turn | None:
        if not game.plays:
            return vf.Turn(seat="alice", message='Write "one" to a.txt, then check it.')
        if len(game.plays) == 1:
            return vf.Turn(seat="bob", message='Write "two" to b.txt, then check it.')
        return None


def _task(bob_harness: str | None = None) -> SharedBox:
    return SharedBox(vf.TaskData(prompt="", workdir="/box"), bob_harness)


@needs_bwrap
async def test_two_seats_of_one_box_running_the_same_agent_are_refused() -> None:
    # Before the refusal this game ran, and alice's codex-events.jsonl was bob's (b.txt only).
    (trace,) = await run_game(_task(), model="scripted:agent", harness="codex", runtime="bwrap")
    (error,) = trace.errors
    assert error.type == "ConfigError" and error.phase == "seating", error
    assert "'alice', 'bob'" in error.message and "'codex'" in error.message, error.message
    assert "separate boxes" in error.message
    assert "boot" not in trace.timing and trace.calls == []  # no box started


@pytest.mark.slow
@pytest.mark.bwrap
@needs_bwrap
async def test_different_agents_in_one_box_keep_their_own_transcripts() -> None:
    need_registry("npm")
    for harness_id in ("codex", "claude-code"):
        _timed_install(harness_id)
    alice, bob = await run_game(
        _task("claude-code"), model="scripted:agent", harness="codex", runtime="bwrap"
    )
    assert alice.errors == [] and bob.errors == [], (alice.errors, bob.errors)
    (mine,), (theirs,) = alice.artifacts, bob.artifacts
    assert mine.name == "codex-events.jsonl" and theirs.name == "claude-events.jsonl"
    assert "a.txt" in mine.content and "b.txt" not in mine.content
    assert "b.txt" in theirs.content and "a.txt" not in theirs.content


def _seats(*specs: tuple[str, str | None, str | None, int]) -> list[vf.Seat]:
    return [
        vf.Seat(name=name, agent=vf.Agent(harness=harness), box=box, runs=runs)
        for name, harness, box, runs in specs
    ]


@pytest.mark.parametrize(
    ("specs", "refused"),
    [
        # Same program in one box, named or the run's own.
        ([("a", None, None, 1), ("b", None, "a", 1)], "'a', 'b'"),
        ([("a", "bash", None, 1), ("b", "codex", "a", 1), ("c", "codex", "a", 1)], "'b', 'c'"),
        # Harnesses that share a home or the ACP transcript.
        ([("a", "codex-acp", None, 1), ("b", None, "a", 1)], "'codex'"),
        ([("a", "claude-code-acp", None, 1), ("b", "claude-code", "a", 1)], "'claude-code'"),
        ([("a", "claude-code-acp", None, 1), ("b", "codex-acp", "a", 1)], "'acp'"),
        # A borrower's runs all play in the owner's box.
        ([("a", "bash", None, 1), ("b", None, "a", 2)], "'b', 'b#2'"),
        # Different programs; chat loops (a transcript per seat); separate boxes; an owner's
        # further runs (boxes of their own).
        ([("a", "claude-code", None, 1), ("b", None, "a", 1)], None),
        ([("a", "bash", None, 1), ("b", "bash", "a", 1)], None),
        ([("a", None, None, 1), ("b", None, None, 1)], None),
        ([("a", None, None, 3), ("b", "bash", "a", 1)], None),
    ],
)
def test_which_seats_of_one_box_are_refused(
    specs: list[tuple[str, str | None, str | None, int]], refused: str | None
) -> None:
    default: type[Harness] = harness_class("codex")
    conflict = shared_box_conflict(_seats(*specs), default)
    if refused is None:
        assert conflict is None
    else:
        assert conflict is not None and refused in conflict, conflict


def test_an_unknown_harness_is_left_to_its_seat() -> None:
    seats = _seats(("a", "no-such-harness", None, 1), ("b", "no-such-harness", "a", 1))
    assert shared_box_conflict(seats, harness_class("codex")) is None
