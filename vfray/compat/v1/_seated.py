"""v1 envs with their own ``run(task, agents)`` (user simulation, multi-agent) as vfray seated
tasks: each top-level ``AgentConfig`` field of the env's config is a
:class:`~vfray.harnesses.seats.Seat`,
and the env's ``run`` is the game's :meth:`~vfray.harnesses.seats.SeatedTask.play` — every
``interaction.turn(message)`` it awaits is one vfray :class:`~vfray.harnesses.seats.Turn` of that
seat, answered with the seat's reply. Each ``run`` / ``interaction`` of a seat is one run of it
(v1 fans a seat out: attempts, one proposer with many solvers): the first plays as ``golfer``,
the next as ``golfer#2``, ... (v1's ``trace.agent.name`` is ``golfer`` for all of them); runs the
env awaits at once (a ``TaskGroup``, ``gather``) play at once, as in v1.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, cast

from vfray.compat.v1._env import AgentConfig, Env, Episode
from vfray.compat.v1._trace import Trace as V1Trace
from vfray.compat.v1.config import HARNESSES, RUNTIMES
from vfray.episode import seat_role
from vfray.errors import ConfigError
from vfray.harnesses.seats import Agent, Ask, Game, Seat, Turn, run_name
from vfray.interception.limits import Limits
from vfray.trace.messages import UserContent, is_user_content

_CLIENT = frozenset({"base_url", "api_key_var"})
_LIMITS = ("max_turns", "max_input_tokens", "max_output_tokens", "max_total_tokens")
RUNS = 64
"""The most runs of one v1 seat in an episode (v1 sets no bound; the env's code decides, e.g.
code_golf's ``attempts``): vfray declares it up front, and it widens the other runs' wait
deadline (``env.timeouts.user`` plus each other run's boot, setup and agent budgets)."""


def seat_configs(env: Env[Any]) -> dict[str, AgentConfig]:
    """The env's agents, by field name, in declaration order (v1's ``Agents`` scrape)."""
    from vfray.compat.v1._kinds import of

    config = env.config
    found = {n: getattr(config, n) for n in type(config).model_fields}
    kind = of(env).AgentConfig  # verifiers' own, for its genuine envs
    return {n: _as_layer(c) for n, c in found.items() if isinstance(c, kind)}


def _as_layer(config: Any) -> AgentConfig:
    """A seat's config as this layer's (what :func:`to_agent` maps): verifiers' own
    ``AgentConfig`` gives the fields it sets, so what vfray cannot honour is refused alike."""
    if isinstance(config, AgentConfig):
        return config
    data = config.model_dump(mode="json", exclude_defaults=True)
    data = {k: v for k, v in data.items() if v is not None}
    for key in ("runtime", "client"):
        # The union member's ``type`` is its own default, so the dump drops it.
        if key in data:
            kind = getattr(getattr(config, key), "type", None)
            data[key] = {**({"type": kind} if kind is not None else {}), **data[key]}
    return AgentConfig.model_validate(data)


def to_agent(name: str, config: AgentConfig) -> Agent:
    """vfray's agent for a v1 seat config; what vfray cannot honour is refused naming it."""
    extras = dict(config.model_extra or {})
    client = extras.pop("client", None) or {}
    if not isinstance(client, dict):
        client = {"?": client}
    # v1 needs `type` to pick its client union's member; `eval` is the only kind vfray runs.
    if client.get("type") == "eval":
        client = {k: v for k, v in client.items() if k != "type"}
    box = extras.pop("runtime", None) or {}
    if not isinstance(box, dict):
        box = {"?": box}
    extra = sorted(extras) + [f"client.{k}" for k in sorted(set(client) - _CLIENT)]
    extra += [f"runtime.{k}" for k in sorted(set(box) - {"type"})]
    runtime = box.get("type")
    if runtime is not None and runtime not in RUNTIMES:
        extra.append(f"runtime.type={runtime} (vfray runs subprocess, docker, modal; also bwrap)")
    if extra or (config.harness is not None and config.harness.model_extra):
        sub = sorted((config.harness.model_extra or {}) if config.harness else {})
        named = [f"env.{name}.{k}" for k in extra] + [f"env.{name}.harness.{k}" for k in sub]
        raise ConfigError(f"v1 options not supported by vfray: {', '.join(named)}")
    harness = None
    if config.harness is not None:
        if config.harness.id not in HARNESSES:
            raise ConfigError(
                f"v1 options not supported by vfray: env.{name}.harness.id={config.harness.id} "
                f"(vfray harnesses for v1 ids: {', '.join(sorted(HARNESSES))})"
            )
        harness = HARNESSES[config.harness.id]
    limits = {k: getattr(config, k) for k in _LIMITS if getattr(config, k) is not None}
    return Agent(
        name=name,
        model=config.model,
        base_url=client.get("base_url"),
        api_key_var=client.get("api_key_var"),
        harness=harness,
        runtime=None if runtime is None else RUNTIMES[runtime],
        limits=Limits(**limits) if limits else None,
    )


@dataclass
class Segment:
    """What ``Interaction.turn`` returns (v1's ``Segment``): the reply, or ``terminated``."""

    messages: list[Any] = field(default_factory=list)
    root_reply: str | None = None
    terminated: bool = False

    @property
    def last_reply(self) -> str:
        return (self.root_reply or "").strip()


class Interaction:
    """One seat's open rollout, as the v1 env holds it: ``turn(message)`` is one vfray turn."""

    def __init__(self, episode: EpisodeBridge, seat: str, run: int, task: Any) -> None:
        self._episode, self._seat, self._run, self._task = episode, seat, run, task
        self._name = run_name(seat, run)
        self._started = False

    @property
    def trace(self) -> V1Trace:
        found = self._episode.views.get(self._name)
        if found is None:
            # A seat opened but never asked (kuhn_poker's player 1 after player 0 forfeits):
            # v1 gives it an empty trace the env records on; vfray ran no rollout for it, so
            # the env writes on a detached one that no run keeps.
            found = self._episode.views[self._name] = _detached(self._name, self._task)
        return found

    async def turn(self, message: str | list[Any] | None = None) -> Segment:
        """One user turn: text, or v1 ``Messages`` (one user message, its content parts
        images too); without one, the task's prompt opens the exchange."""
        if message is None:
            if self._started:
                raise ValueError("turn() without a message only opens a prompted task")
            content = prompt_content(self._task.data)
        else:
            content = turn_content(message)
        self._started = True
        turn = Turn(seat=self._seat, message=content, run=self._run)
        reply = await self._episode.ask(turn)
        return Segment(root_reply=reply)


def _plain(value: Any) -> Any:
    """v1 messages and content parts (verifiers' or this layer's models, or wire dicts) as
    plain JSON data."""
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json", exclude_none=True)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def turn_content(messages: str | list[Any]) -> UserContent:
    """What a v1 ``interaction.turn(messages)`` sends: text, or its one user message's content
    (parts kept, images too). vfray sends one user message per turn: more is refused."""
    if isinstance(messages, str):
        return messages
    dumped = [_plain(m) for m in messages]
    if len(dumped) != 1 or not isinstance(dumped[0], dict) or dumped[0].get("role") != "user":
        roles = [m.get("role") if isinstance(m, dict) else type(m).__name__ for m in dumped]
        raise ConfigError(
            f"interaction.turn() got messages with roles {roles}: vfray sends a turn as one "
            "user message (text or content parts)"
        )
    content = dumped[0].get("content")
    if not is_user_content(content):
        raise ConfigError(f"interaction.turn(): a user message's content of {content!r:.80}")
    return cast(UserContent, content)


def prompt_content(data: Any) -> UserContent:
    """What opens a prompted task's exchange: its prompt's text, as before, unless the prompt
    has images: then its one user message's parts."""
    prompt = data.prompt
    if isinstance(prompt, str) or not prompt:
        return str(data.prompt_text)
    dumped = _plain(list(prompt))
    parts = [p for m in dumped if isinstance(m.get("content"), list) for p in m["content"]]
    if all(isinstance(p, dict) and p.get("type") == "text" for p in parts):
        return str(data.prompt_text)
    return turn_content(dumped)


def _detached(seat: str, task: Any) -> V1Trace:
    from vfray.compat.v1._trace import TraceTask
    from vfray.trace import Trace
    from vfray.trace.records import TaskRecord

    data = task.data
    kind = f"{type(data).__module__}:{type(data).__qualname__}"
    record = TaskRecord(key=task.key, hash=task.hash, type=kind)
    return V1Trace(Trace(seat=seat, task=record), TraceTask(kind, data, task.key, task.hash))


class SeatAgent:
    """``agents.<seat>`` for the v1 env: ``interaction(task)`` and ``run(task)``."""

    def __init__(self, episode: EpisodeBridge, name: str) -> None:
        self._episode, self.name = episode, name
        self.trainable = True
        """v1's ``Env.setup`` may set it False: the seat's traces (every run) are then marked
        ``trace.agent.trainable = False`` and get no advantage (as ``vf.Seat(trainable=False)``)."""

    @asynccontextmanager
    async def interaction(self, task: Any, **borrowed: Any) -> AsyncIterator[Interaction]:
        _refuse_borrowed(self.name, borrowed)
        run = self._episode.runs[self.name] = self._episode.runs.get(self.name, 0) + 1
        if run > RUNS:
            raise ConfigError(
                f"agents.{self.name}: more than {RUNS} runs / interactions in one episode "
                "(vfray's bound on a v1 seat's fan-out)"
            )
        self._episode.tasks[run_name(self.name, run)] = task
        yield Interaction(self._episode, self.name, run, task)

    async def run(self, task: Any, **borrowed: Any) -> V1Trace | None:
        async with self.interaction(task, **borrowed) as interaction:
            await interaction.turn()
        return interaction.trace


def _refuse_borrowed(seat: str, borrowed: dict[str, Any]) -> None:
    given = sorted(k for k, v in borrowed.items() if v not in (None, False))
    if given:
        raise ConfigError(
            f"agents.{seat}: {', '.join(given)}= is not supported on vfray (a seat runs in its "
            "own box, or shares another seat's through vf.Seat(box=...))"
        )


class Agents:
    """What a v1 env's ``run(task, agents)`` gets: ``agents.<seat>`` per seat (also served as
    ``vf.Agents``, which envs name in annotations)."""

    def __init__(self, episode: EpisodeBridge, names: list[str]) -> None:
        for name in names:
            setattr(self, name, SeatAgent(episode, name))


class EpisodeBridge:
    """One game: the v1 env's ``setup`` and ``run`` as the game's ``play`` (each turn an
    interaction awaits is asked of vfray's game, concurrently where the env awaits several), and
    its ``finalize`` over the seats' traces once every seat has ended."""

    def __init__(self, env: Env[Any], task: Any, seats: list[str]) -> None:
        self.env, self.task, self.seats = env, task, seats
        self.tasks: dict[str, Any] = {}
        """The v1 task each seat run plays (the one its ``interaction`` was opened with), by its
        run's name (``golfer``, ``golfer#2``)."""
        self.runs: dict[str, int] = {}
        """How many runs / interactions each seat has opened so far."""
        self.views: dict[str, V1Trace] = {}
        self.started: set[str] = set()
        self.finished: dict[str, V1Trace] = {}
        self._ask: Ask | None = None
        self._runner: asyncio.Task[Any] | None = None
        self._finalized: asyncio.Future[None] | None = None
        self.agents = Agents(self, self.seats)

    async def play(self, ask: Ask) -> None:
        """The env's ``setup`` and ``run``, its interactions' turns asked through ``ask``."""
        self._ask, self._runner = ask, asyncio.current_task()
        await self.env.setup(self.agents)
        await self.env.run(self.task, self.agents)

    async def ask(self, turn: Turn) -> str:
        assert self._ask is not None, "a v1 interaction's turn outside the game's play"
        return (await self._ask(turn)) or ""

    def game_over(self) -> None:
        """Called by each seat's ``finalize``: the game is over, the env's ``run`` with it."""
        if self._runner is not None and not self._runner.done():
            self._runner.cancel()  # the game ended under it (a seat failed, a limit)

    async def seat_ended(self, seat: str, view: V1Trace, game: Game) -> None:
        """Called by each seat once it is scored; the last runs the env's ``finalize`` (a seat
        that failed may end without reaching here: it is not waited for)."""
        agent = getattr(self.agents, seat_role(seat) or seat, None)
        if agent is not None and not agent.trainable:
            view.vfray.agent = view.vfray.agent.model_copy(update={"trainable": False})
        self.game_over()
        self.finished[seat] = view
        if self._finalized is None:
            self._finalized = asyncio.get_running_loop().create_future()
        if not self._finalized.done() and set(self.finished) >= self.started - set(game.failed):
            try:
                ok = all(v.ok for v in self.finished.values())
                views = list(self.finished.values())
                await self.env.finalize(self.task, Episode(ok=ok, traces=views))
            except BaseException as exc:
                self._finalized.set_exception(exc)
            else:
                self._finalized.set_result(None)
        await asyncio.shield(self._finalized)


_EPISODES: weakref.WeakKeyDictionary[Game, EpisodeBridge] = weakref.WeakKeyDictionary()


def bridge_for(game: Game, env: Env[Any], task: Any) -> EpisodeBridge:
    found = _EPISODES.get(game)
    if found is None:
        found = _EPISODES[game] = EpisodeBridge(env, task, [s.name for s in game.seats])
    return found


def seats_of(env: Env[Any]) -> list[Seat]:
    return [Seat(name=n, agent=to_agent(n, c), runs=RUNS) for n, c in seat_configs(env).items()]


def runs_itself(env: Env[Any]) -> bool:
    """Whether the env plays its agents itself (its own ``run``), as opposed to best-of-n's
    independent attempts (vfray's group) or the single-agent default."""
    from vfray.compat.v1._kinds import of

    k = of(env)  # verifiers' own classes for its genuine envs
    if isinstance(env, k.BestOfNEnv):
        return False
    return type(env).run is not k.SingleAgentEnv.run and type(env).run is not k.Env.run
