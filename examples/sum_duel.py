"""Example two-seat game: two agents take turns adding to a running total; the first wrong sum
loses. Each seat can be a different model (``models``), each seat's calls land in its own trace,
and each seat gets its own reward (1 win, 0.5 draw, 0 loss).

Run: ``vfray eval examples/sum_duel.py:SumDuels --harness null -m scripted:arithmetic
--taskset-args '{"models": {"bob": "scripted:arithmetic?accuracy=0.3"}}'``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence

import vfray as vf
from vfray.harnesses.seats import Game

_SUM = re.compile(r"What is (-?\d+) \+ (-?\d+)\?")


class Duel(vf.TaskData):
    start: int
    addends: list[int]
    """One addend per turn; turns alternate between the two seats."""


class SumDuel(vf.SeatedTask[Duel]):
    def __init__(self, data: Duel, models: dict[str, str] | None = None) -> None:
        super().__init__(data)
        self.models = models or {}

    def seats(self) -> Sequence[vf.Seat]:
        return [
            vf.Seat(name=name, agent=vf.Agent(name=name, model=self.models.get(name)))
            for name in ("alice", "bob")
        ]

    def next_turn(self, game: Game) -> vf.Turn | None:
        played = len(game.plays)
        if _losers(game) or played == len(self.data.addends):
            return None
        total = self.data.start if game.last is None else int(game.last.reply or 0)
        seat = ("alice", "bob")[played % 2]
        return vf.Turn(seat=seat, message=f"What is {total} + {self.data.addends[played]}?")

    @vf.reward
    def won(self) -> float:
        assert self.game is not None
        losers = _losers(self.game)
        if not losers:
            return 0.5
        return 0.0 if self.seat in losers else 1.0


def _losers(game: Game) -> set[str]:
    """Seats that answered a sum wrong, or whose agent failed."""
    out = set(game.failed)
    for play in game.plays:
        match = _SUM.search(play.message)
        assert match is not None
        if (play.reply or "").strip() != str(int(match[1]) + int(match[2])):
            out.add(play.seat)
    return out


class SumDuels(vf.Taskset[SumDuel]):
    def __init__(self, n: int = 4, rounds: int = 4, models: dict[str, str] | None = None) -> None:
        self.n, self.rounds, self.models = n, rounds, models

    def load(self) -> Iterator[SumDuel]:
        for i in range(self.n):
            addends = [(i * 7 + k * 3) % 10 + 1 for k in range(self.rounds)]
            yield SumDuel(Duel(start=10 * i, addends=addends), self.models)
