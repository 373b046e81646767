"""Seats sharing one box and taking alternate turns: each seat's chat-loop transcript is its
own, so a seat resuming after another seat used the box continues its own conversation (local
backend, subprocess, bwrap and docker boxes, the scripted model)."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from docker_engine import box_options

import vfray as vf
from vfray._plugins import load_object
from vfray.harnesses.chat import TRANSCRIPT_PATH, transcript_path
from vfray.run.environment import run_game

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SumDuels = load_object(f"{EXAMPLES}/sum_duel.py:SumDuels")
SumDuel = vars(sys.modules[SumDuels.__module__])["SumDuel"]


class SharedDuel(SumDuel):  # type: ignore[misc,valid-type]
    """The sum duel with bob playing in alice's box."""

    def seats(self) -> Sequence[vf.Seat]:
        return [vf.Seat(name="alice"), vf.Seat(name="bob", box="alice")]


def _user_texts(trace: vf.Trace) -> list[str]:
    return [m.text for m in trace.messages if m.role == "user"]


@pytest.mark.parametrize(
    "runtime",
    [
        "subprocess",
        pytest.param(
            "bwrap", marks=pytest.mark.skipif(shutil.which("bwrap") is None, reason="no bwrap")
        ),
        "docker",
    ],
)
async def test_seats_sharing_a_box_each_resume_their_own_transcript(
    runtime: str, request: pytest.FixtureRequest
) -> None:
    options = box_options(runtime, request)
    task: Any = SharedDuel(next(iter(SumDuels(n=1, rounds=4).load())).data)
    alice, bob = await run_game(
        task,
        model="scripted:arithmetic",
        harness="null",
        runtime=runtime,
        runtime_options=options,
    )
    assert alice.ok and bob.ok, (alice.errors, bob.errors)
    # Alternate turns in one box: each seat's second segment resumes its own conversation only.
    assert _user_texts(alice) == ["What is 0 + 1?", "What is 5 + 7?"]
    assert _user_texts(bob) == ["What is 1 + 4?", "What is 12 + 10?"]
    assert [m.role for m in alice.messages].count("assistant") == 2
    assert alice.reward == bob.reward == 0.5  # both right every round: a draw


def test_transcript_paths_are_per_seat() -> None:
    assert transcript_path(None) == TRANSCRIPT_PATH
    paths = {transcript_path(s) for s in ("alice", "bob", "a/b", "a_b", "../x")}
    assert len(paths) == 5
    assert all(p.startswith(".vfray/transcript-") and "/" not in p[8:] for p in paths)
