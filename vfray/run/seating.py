"""Plays one game of a :class:`~vfray.harnesses.seats.SeatedTask`: each run of a seat is one
rollout (its own box, harness, interception session and trace) started on its first turn; a turn
is one harness segment, whose reply the task's ``next_turn`` reads before naming the next seat.
A seat's further runs (``Turn.run``, up to ``Seat.runs``) are rollouts of their own, named
``solver#2``, ... (:func:`~vfray.harnesses.seats.run_name`). Seats that share a box get one box
(the owner's first run's), stopped by the last of them. Used by the local environment and by
SandboxHosts alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, cast

from vfray.errors import ConfigError, TaskError
from vfray.harnesses.base import Harness
from vfray.harnesses.seats import (
    Agent,
    Game,
    Play,
    Seat,
    SeatedTask,
    Turn,
    check_seats,
    run_name,
)
from vfray.rollout import RolloutPlan, SessionBroker, execute_rollout
from vfray.run._shared_box import Lease, SharedBox
from vfray.run.broker import InProcessBroker
from vfray.run.seat_refusals import shared_box_conflict, unseatable
from vfray.runtimes.base import Runtime
from vfray.runtimes.registry import make_runtime, task_spec
from vfray.task import call_maybe_async
from vfray.trace import Trace
from vfray.trace.messages import UserContent

EndpointOpener = Callable[[Agent, str], AbstractAsyncContextManager[Any]]
"""Opens a seat's own model endpoint and interception (``agent``, the model it names): the
caller's kind of environment (:func:`vfray.run.environment.open_endpoint`), passed in so seating
never imports the environment that plays its games."""


@dataclass(frozen=True)
class Station:
    """Everything one agent needs to run a rollout here: resolved once, passed down whole."""

    plan: RolloutPlan
    harness: Harness
    runtime_options: Mapping[str, Any]
    broker: SessionBroker
    interception_url: str


class Stations:
    """The run's own station, and one per other :class:`~vfray.harnesses.seats.Agent` a seat names:
    an agent with its own model gets its own endpoint and interception (opened on first use,
    closed with :meth:`aclose`); one that changes only the harness or runtime shares the run's.

    With the Serve pool (``farm.interception = "serve"``) the run's station is the node's replica
    and a seat's own model still gets an in-process interception here, in the host: the pool's
    replicas hold one upstream (the run's model), a Serve application per seat model would cost
    a deployment per model, and a game lives and dies with its host anyway (retried whole), so a
    session held in the host adds no way to lose one."""

    def __init__(self, default: Station, open_endpoint: EndpointOpener) -> None:
        self.default = default
        self._open_endpoint = open_endpoint
        self._stack = contextlib.AsyncExitStack()
        self._endpoints: dict[tuple[str | None, str | None, str | None], Any] = {}
        self._lock = asyncio.Lock()
        self.policy_version: int | None = None

    def set_policy_version(self, version: int | None) -> None:
        """Stamp ``version`` on the calls of every seat's own endpoint too (the run's own
        interception is stamped by its owner)."""
        self.policy_version = version
        for env in self._endpoints.values():
            env.interception.app.policy_version = version

    async def station(self, agent: Agent) -> Station:
        base = self.default
        plan = base.plan.model_copy(
            update={
                "model": agent.model or base.plan.model,
                "harness_id": agent.harness or base.plan.harness_id,
                "runtime_type": agent.runtime or base.plan.runtime_type,
                "sampling": base.plan.sampling if agent.sampling is None else agent.sampling,
                "limits": agent.limits or base.plan.limits,
                "agent_name": agent.name,
            }
        )
        harness = base.harness
        if agent.harness is not None:
            from vfray.harnesses.registry import make_harness

            harness = make_harness(agent.harness, agent.harness_options)
        runtime_options = base.runtime_options if agent.runtime is None else agent.runtime_options
        broker, url = base.broker, base.interception_url
        if agent.own_endpoint:
            env = await self._endpoint(agent)
            broker, url = InProcessBroker(env.interception.app), env.interception.url
        return Station(plan, harness, runtime_options, broker, url)

    async def _endpoint(self, agent: Agent) -> Any:
        key = (agent.model, agent.base_url, agent.api_key_var)
        async with self._lock:
            if key not in self._endpoints:
                opened = self._open_endpoint(agent, agent.model or self.default.plan.model)
                env = await self._stack.enter_async_context(opened)
                env.interception.app.policy_version = self.policy_version
                self._endpoints[key] = env
            return self._endpoints[key]

    async def aclose(self) -> None:
        await self._stack.aclose()


class _Player:
    """One seat's rollout and the two queues its turns pass through: the messages the game sends
    it (read by its task copy's ``next_message``) and the replies of its segments."""

    def __init__(self) -> None:
        self.inbox: asyncio.Queue[UserContent | TaskError | None] = asyncio.Queue()
        self.replies: asyncio.Queue[str | None] = asyncio.Queue()
        self.asked = False
        self.rollout: asyncio.Future[Trace] | None = None
        self.ended = asyncio.Event()
        """Set when its agent phase is over (it takes no more turns)."""
        self.trace: Trace | None = None
        """Its trace, once the agent phase is over."""
        self.over = asyncio.Event()
        """The game's end (shared by its players)."""

    def __reduce__(self) -> tuple[type[_Player], tuple[()]]:
        # A seat's task copy travels with its stop check to a Serve replica (pickled); the
        # game's queues, events and futures stay here: the replica never plays a turn.
        return (_Player, ())

    async def next_message(self, trace: Trace) -> UserContent | None:
        if self.asked:  # a segment just ended: its reply is this turn's
            self.replies.put_nowait(trace.last_reply)
        self.asked = True
        item = await self.inbox.get()
        if isinstance(item, TaskError):
            raise item
        return item

    async def play(self, message: UserContent) -> tuple[bool, str | None]:
        """Send one turn; (True, reply) once the segment ended, (False, None) when the rollout
        ended instead (a crash, a limit, a timeout)."""
        assert self.rollout is not None
        self.inbox.put_nowait(message)
        reply = asyncio.ensure_future(self.replies.get())
        ended = asyncio.ensure_future(self.ended.wait())
        try:
            either: set[asyncio.Future[Any]] = {reply, ended, self.rollout}
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in (reply, ended):
                if not waiter.done():
                    waiter.cancel()
        if reply.done() and not reply.cancelled():
            return True, reply.result()
        return False, None

    def why(self) -> str:
        """What ended its rollout before its turn did."""
        trace = self.trace
        if trace is None and self.rollout is not None and self.rollout.done():
            trace = self.rollout.result()
        if trace is None:
            return "ended"
        err = trace.error()
        if err is not None:
            return f"{err.type}: {err.message}"
        return f"stopped: {trace.stop_condition.value if trace.stop_condition else 'unknown'}"


def _seat_task(
    task: SeatedTask[Any], seat: Seat, name: str, game: Game, player: _Player
) -> SeatedTask[Any]:
    """The task as one seat run (``name``) plays it: no prompt (its turns' messages are its user
    messages), ``seat`` and ``game`` set, the task's own identity on its trace, and a
    ``finalize`` that waits for the game to be over (a seat that crashed is scored knowing it
    did)."""
    update: dict[str, Any] = {"prompt": None}
    if seat.system_prompt is not None:
        update["system_prompt"] = seat.system_prompt
    own = copy.copy(task)
    own.data = task.data.model_copy(update=update)
    own._key = task.key
    own.seat, own.game = name, game
    record = task.record()
    # Instance attributes shadow the methods for this copy only.
    setattr(own, "record", lambda: record)  # noqa: B010
    setattr(own, "next_message", player.next_message)  # noqa: B010

    async def finalize(trace: Trace, runtime: Runtime) -> None:
        if not seat.trainable:
            trace.agent = trace.agent.model_copy(update={"trainable": False})
        player.trace = trace
        player.ended.set()
        await player.over.wait()
        await call_maybe_async(task.finalize.__func__, own, trace, runtime)  # type: ignore[attr-defined]

    setattr(own, "finalize", finalize)  # noqa: B010
    return own


async def play_game(
    task: SeatedTask[Any],
    stations: Stations,
    *,
    rollout_index: int = 0,
    attempt: int = 0,
    run_id: str | None = None,
    episode_id: str | None = None,
) -> list[Trace]:
    """Play one game of ``task``; one trace per seat run that got a turn, in seating order.

    A seat whose rollout ends before its turn does (its harness crashed, a limit stopped it)
    ends the game: its error is on its own trace, ``game.failed`` names it, and the other seats'
    rollouts finish and are scored as usual. Never raises for rollout failures; cancellation
    tears every box down and propagates."""
    ids: dict[str, Any] = {
        "rollout_index": rollout_index,
        "attempt": attempt,
        "run_id": run_id,
        "episode_id": episode_id,
    }
    default_plan = stations.default.plan
    try:
        seats = check_seats(task.seats())
    except Exception as exc:
        return [unseatable(task, default_plan, TaskError(f"seats(): {exc}"), **ids)]
    conflict = shared_box_conflict(seats, type(stations.default.harness))
    if conflict is not None:  # refused before any box starts
        return [unseatable(task, default_plan, ConfigError(conflict), **ids)]
    by_name = {s.name: s for s in seats}
    game = Game(seats)
    over = asyncio.Event()
    players: dict[str, _Player] = {}
    boxes: dict[str, SharedBox] = {}
    borrowed = {s.box for s in seats if s.box is not None}
    timeouts = default_plan.timeouts
    # A seat waits for the others' turns (and their boots) between its own: charge that to its
    # "user" deadline, never to its agent budget. Every run a seat may make is one more rollout
    # to wait for.
    others = sum(s.runs for s in seats) - 1
    waiting = timeouts.user + others * (timeouts.agent + timeouts.boot + timeouts.setup)

    async def seat_up(seat: Seat, name: str, player: _Player) -> None:
        player.over = over
        station = await stations.station(seat.agent)
        plan = station.plan.model_copy(
            update={
                "seat": name,
                "timeouts": station.plan.timeouts.model_copy(update={"user": waiting}),
            }
        )
        # A borrower's runs share the owner's box; an owner's further runs get boxes of their own.
        owner = seat.box or name
        runtime: Runtime
        if owner in borrowed:
            owner_station = (
                station if owner == seat.name else await stations.station(by_name[owner].agent)
            )
            if owner not in boxes:  # checked after the await: seats are seated concurrently
                boxes[owner] = SharedBox(
                    make_runtime(
                        owner_station.plan.runtime_type,
                        task_spec(task.data),
                        **dict(owner_station.runtime_options),
                    )
                )
            runtime = cast(Runtime, Lease(boxes[owner]))
        else:
            runtime = make_runtime(
                plan.runtime_type, task_spec(task.data), **dict(station.runtime_options)
            )
        player.rollout = asyncio.ensure_future(
            execute_rollout(
                _seat_task(task, seat, name, game, player),
                plan=plan,
                harness=station.harness,
                runtime=runtime,
                broker=station.broker,
                interception_url=station.interception_url,
                **ids,
            )
        )

    ending: TaskError | None = None
    unseated: list[Trace] = []
    busy: set[str] = set()
    activity = asyncio.Event()
    """Set whenever a turn starts or ends (the driver's idle deadline restarts)."""

    def check_turn(turn: object) -> Turn:
        if not isinstance(turn, Turn):
            raise TypeError(f"expected a vf.Turn or None, got {type(turn).__name__}")
        if turn.seat not in by_name:
            raise ValueError(f"no seat named {turn.seat!r}")
        declared = by_name[turn.seat].runs
        if turn.run > declared:
            seat = turn.seat
            raise ValueError(f"run {turn.run} of seat {seat!r}, which declares runs={declared}")
        return turn

    async def take(turn: Turn) -> str | None:
        """Play one checked turn and give its reply; raises :class:`_GameEnded` when the game
        ended at it (its seat could not be seated, or its rollout ended before the turn)."""
        name = run_name(turn.seat, turn.run)
        if game.over:
            raise _GameEnded(f"the game is over; {name} got no turn")
        if name in busy:
            raise ValueError(f"{name} already has a turn in play (a run takes one at a time)")
        busy.add(name)
        activity.set()
        try:
            player = players.get(name)
            if player is None:
                seat = by_name[turn.seat]
                players[name] = player = _Player()  # seats are listed in the order first asked
                try:
                    await seat_up(seat, name, player)
                except Exception as exc:  # an unknown harness or runtime, a missing key
                    error = exc if isinstance(exc, ConfigError) else TaskError(str(exc))
                    unseated.append(unseatable(task, default_plan, error, seat, name, **ids))
                    game.failed[name] = f"{type(error).__name__}: {error}"
                    raise _GameEnded(game.failed[name]) from None
            answered, reply = await player.play(turn.message)
            if not answered:
                game.failed[name] = player.why()
                raise _GameEnded(game.failed[name])
            game.plays.append(Play(seat=name, message=turn.message, reply=reply))
            return reply
        finally:
            busy.discard(name)
            activity.set()

    async def one_at_a_time() -> TaskError | None:
        while True:
            try:
                # Untimed for the agents, like a user's next message, and under the same deadline.
                turn = await asyncio.wait_for(call_maybe_async(task.next_turn, game), timeouts.user)
                if turn is not None:
                    turn = check_turn(turn)
            except TimeoutError:
                return TaskError(f"next_turn did not answer within {timeouts.user:g}s")
            except Exception as exc:
                return TaskError(f"next_turn failed: {type(exc).__name__}: {exc}")
            if turn is None:
                return None
            try:
                await take(turn)
            except _GameEnded:
                return None

    async def concurrently() -> TaskError | None:
        async def ask(turn: Turn) -> str | None:
            return await take(check_turn(turn))

        driver = asyncio.ensure_future(task.play(game, ask))
        while not driver.done():
            activity.clear()
            # Untimed while a turn is in play; between turns, the user deadline (as next_turn).
            idle = None if busy else timeouts.user
            woke = asyncio.ensure_future(activity.wait())
            await asyncio.wait({driver, woke}, timeout=idle, return_when=asyncio.FIRST_COMPLETED)
            woke.cancel()
            if game.failed and not driver.done():
                driver.cancel()  # a seat ended the game: so does the task's play
            elif not driver.done() and not activity.is_set() and not busy:
                driver.cancel()
                await asyncio.gather(driver, return_exceptions=True)
                return TaskError(f"play did not ask for a turn within {timeouts.user:g}s")
        await asyncio.gather(driver, return_exceptions=True)
        if game.failed or driver.cancelled():
            return None
        exc = driver.exception()
        if exc is None:
            return None
        while isinstance(exc, BaseExceptionGroup):  # a TaskGroup's cause, not "1 sub-exception"
            exc = exc.exceptions[0]
        return TaskError(f"play failed: {type(exc).__name__}: {exc}")

    def rollouts() -> list[asyncio.Future[Trace]]:
        # In the order the seat runs were first asked for (not the order their seating ended).
        return [p.rollout for p in players.values() if p.rollout is not None]

    own_play = type(task).play is not SeatedTask.play
    try:
        ending = await (concurrently() if own_play else one_at_a_time())
        game.over = True
        over.set()
        for player in players.values():
            player.inbox.put_nowait(ending)
        traces = [*await asyncio.gather(*rollouts()), *unseated]
    except BaseException:
        for rollout in rollouts():
            rollout.cancel()
        await asyncio.gather(*rollouts(), return_exceptions=True)
        raise
    finally:
        for box in boxes.values():
            with contextlib.suppress(Exception):
                await box.close()
    if not traces:
        return [unseatable(task, default_plan, ending or TaskError("no seat got a turn"), **ids)]
    return traces


class _GameEnded(Exception):
    """Raised by a turn the game ended at (inside :meth:`SeatedTask.play`)."""
