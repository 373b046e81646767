"""Example proposer/solver episode: the proposer writes a question whose answer is a target
number, then the solver (which sees only the proposer's question) answers it. Each seat's
calls are its own trace; the solver is rewarded for the target, the proposer for a question
the solver got right. The seats may use different models (``proposer_model``, ``solver_model``).

Run: ``vfray eval examples/proposer_solver.py:ProposerSolver --harness null
-m scripted:arithmetic --taskset-args '{"proposer_model": "scripted:echo"}'`` (the scripted
echo model "proposes" by repeating its instructions, which the arithmetic model then solves).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import vfray as vf
from vfray.harnesses.seats import Game


class Target(vf.TaskData):
    target: int


class ProposeSolve(vf.SeatedTask[Target]):
    def __init__(
        self, data: Target, proposer_model: str | None = None, solver_model: str | None = None
    ) -> None:
        super().__init__(data)
        self.proposer_model, self.solver_model = proposer_model, solver_model

    def seats(self) -> Sequence[vf.Seat]:
        return [
            vf.Seat(
                name="proposer",
                agent=vf.Agent(name="proposer", model=self.proposer_model),
                system_prompt="You write arithmetic questions.",
            ),
            vf.Seat(name="solver", agent=vf.Agent(name="solver", model=self.solver_model)),
        ]

    def next_turn(self, game: Game) -> vf.Turn | None:
        if not game.plays:
            return vf.Turn(
                seat="proposer",
                message=(
                    f"Write one short arithmetic question whose answer is {self.data.target}, "
                    f"such as: What is {self.data.target - 5} + 5?"
                ),
            )
        if len(game.plays) == 1 and game.last is not None and game.last.reply:
            return vf.Turn(seat="solver", message=game.last.reply)
        return None

    def _solved(self) -> bool:
        assert self.game is not None
        answers = self.game.replies("solver")
        return bool(answers) and (answers[0] or "").strip() == str(self.data.target)

    @vf.reward
    def correct(self) -> bool:
        # The solver is right; for the proposer, its question was answerable and on target.
        return self._solved()


class ProposerSolver(vf.Taskset[ProposeSolve]):
    def __init__(
        self, n: int = 4, proposer_model: str | None = None, solver_model: str | None = None
    ) -> None:
        self.n, self.proposer_model, self.solver_model = n, proposer_model, solver_model

    def load(self) -> Iterator[ProposeSolve]:
        for i in range(self.n):
            yield ProposeSolve(Target(target=17 + 5 * i), self.proposer_model, self.solver_model)
