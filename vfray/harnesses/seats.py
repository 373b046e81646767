"""Several agents in one episode: :class:`Agent` (harness x model x runtime), the :class:`Seat`s a
:class:`SeatedTask` declares, and the :class:`Game` its ``next_turn`` reads to say which seat acts
next with what message. Each run of a seat is one rollout with its own trace (a seat declared
with ``runs > 1`` may be run again in the same game: attempts, one proposer with many solvers);
a task that overrides :meth:`SeatedTask.play` instead asks for turns itself, several at once (a
seat's runs played concurrently). :mod:`vfray.run.seating` plays the game.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from vfray.episode import RUN_MARK
from vfray.errors import ConfigError
from vfray.interception.limits import Limits
from vfray.task import Task, TaskData
from vfray.trace.messages import UserContent

__all__ = ["Agent", "Ask", "Game", "Play", "Seat", "SeatedTask", "Turn", "run_name"]


class Agent(BaseModel):
    """Who plays a seat: a harness driving a model in a runtime. A field left ``None`` is the
    run's own (its model endpoint, harness, runtime, sampling, limits)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str | None = None
    model: str | None = None
    """A model name, ``scripted:<policy>`` or ``local:smollm2``, as for the run."""
    base_url: str | None = None
    api_key_var: str | None = None
    harness: str | None = None
    harness_options: dict[str, Any] = Field(default_factory=dict)
    runtime: str | None = None
    runtime_options: dict[str, Any] = Field(default_factory=dict)
    sampling: dict[str, Any] | None = None
    limits: Limits | None = None

    @property
    def own_endpoint(self) -> bool:
        """Whether the seat talks to a model endpoint other than the run's."""
        return self.model is not None or self.base_url is not None


class Seat(BaseModel):
    """One place at the table. ``box`` names another seat whose box this seat works in (a judge
    inspecting a solver's files); ``system_prompt`` replaces the task's for this seat."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    agent: Agent = Field(default_factory=Agent)
    box: str | None = None
    system_prompt: str | None = None
    runs: int = Field(1, ge=1)
    """How many times ``next_turn`` may start this seat in one game (``Turn.run``): each run is
    a rollout of its own, in its own box, with its own trace (``seat`` = ``solver``,
    ``solver#2``, ...). The other seats' wait deadline counts every run."""
    trainable: bool = True
    """False for a seat that does not train the run's policy (a judge, a simulated user): its
    traces are marked (``trace.agent.trainable``), get no advantage and enter no batch."""


def run_name(seat: str, run: int = 1) -> str:
    """The ``seat`` its ``run``-th run's trace and plays carry: ``solver``, ``solver#2``, ..."""
    return seat if run == 1 else f"{seat}{RUN_MARK}{run}"


class Turn(BaseModel):
    """What ``next_turn`` asks for: ``seat`` acts on ``message`` (text, or chat content parts:
    images; a harness that keeps one live text-only session refuses an image); ``run`` picks
    which of the seat's runs (1 by default; a new number starts another rollout of the seat,
    up to ``Seat.runs``)."""

    model_config = ConfigDict(frozen=True)

    seat: str
    message: UserContent
    run: int = Field(1, ge=1)


class Play(BaseModel):
    """A finished turn: the seat (its run's name, :func:`run_name`), the message it got, and
    its reply (None: it said nothing)."""

    model_config = ConfigDict(frozen=True)

    seat: str
    message: UserContent
    reply: str | None


class Game:
    """The state of one play of a seated task, as ``next_turn`` and the reward hooks see it
    (``self.game`` on each seat's task): the turns played so far, and the seats that failed."""

    def __init__(self, seats: Sequence[Seat]) -> None:
        self.seats: tuple[Seat, ...] = tuple(seats)
        self.plays: list[Play] = []
        self.failed: dict[str, str] = {}
        """Seat (run) name → the error that ended its rollout early (the game ended with it)."""
        self.over = False

    @property
    def last(self) -> Play | None:
        return self.plays[-1] if self.plays else None

    def replies(self, seat: str) -> list[str | None]:
        """The replies ``seat`` gave, in order."""
        return [p.reply for p in self.plays if p.seat == seat]


Ask = Callable[[Turn], Awaitable[str | None]]
"""What :meth:`SeatedTask.play` gets: ``await ask(turn)`` plays one turn and gives its reply."""

DataT = TypeVar("DataT", bound=TaskData)


class SeatedTask(Task[DataT]):
    """A task played by several agents. Override :meth:`seats` and :meth:`next_turn`.

    Each seat runs as one rollout on a copy of this task whose ``seat`` is the seat's name
    (its run's: ``solver#2`` for a seat's second run) and ``game`` the shared :class:`Game`:
    ``setup``, ``finalize`` and every ``@vf.reward`` / ``@vf.metric`` hook run once per seat
    run, on that run's trace, after the game is over (so a
    reward can read the whole game). The task's ``prompt`` is not sent: seats hear only the
    messages of their turns.
    """

    seat: str | None = None
    game: Game | None = None

    def seats(self) -> Sequence[Seat]:
        raise NotImplementedError(f"{type(self).__name__} must define seats()")

    def next_turn(self, game: Game) -> Awaitable[Turn | None] | Turn | None:
        """The next seat to act and its message, or None when the game is over."""
        raise NotImplementedError(f"{type(self).__name__} must define next_turn()")

    async def play(self, game: Game, ask: Ask) -> None:
        """Play the game by asking for turns: ``await ask(turn)`` is the turn's reply, and the
        game is over when this returns. Override it instead of :meth:`next_turn` to play turns
        of different seat runs at once (``asyncio.gather`` / a ``TaskGroup`` of ``ask`` calls:
        a seat's runs fanned out, as verifiers v1 runs them); each run takes one turn at a
        time. A turn that ends the game (its seat's rollout ended first) raises, and this
        coroutine is cancelled; so is one that goes ``env.timeouts.user`` without a turn in play.
        Not overridden, :mod:`vfray.run.seating` calls :meth:`next_turn` one turn at a time."""
        raise NotImplementedError(f"{type(self).__name__} must define next_turn() or play()")


def check_seats(seats: Sequence[Seat]) -> tuple[Seat, ...]:
    """Refuse an empty table, duplicate names (or ones with the run mark ``#``), and a ``box``
    naming no seat or a borrower."""
    seats = tuple(seats)
    if not seats:
        raise ConfigError("a seated task needs at least one seat")
    names = [s.name for s in seats]
    marked = [n for n in names if RUN_MARK in n]
    if marked:
        raise ConfigError(f"seat names must not contain {RUN_MARK!r} (it numbers runs): {marked}")
    if len(set(names)) != len(names):
        raise ConfigError(f"seat names must be unique: {names}")
    by_name = {s.name: s for s in seats}
    for seat in seats:
        if seat.box is None:
            continue
        owner = by_name.get(seat.box)
        if owner is None:
            raise ConfigError(f"seat {seat.name!r} shares the box of unknown seat {seat.box!r}")
        if owner.box is not None or owner.name == seat.name:
            raise ConfigError(f"seat {seat.name!r} must share the box of a seat that owns one")
    return seats
