"""v1 tasks as vfray tasks: the row becomes a vfray ``TaskData`` (with the v1 row kept on it),
and each v1 hook becomes a vfray hook of the same name that calls it with v1's injection rules
and a v1 view of the trace. What vfray cannot run yet is refused here, in one line."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Iterator
from typing import Any, ClassVar

import cloudpickle

import vfray.scoring as scoring
from vfray._hook_calls import run_in_hook_thread
from vfray.compat.v1._data import TaskData as V1TaskData
from vfray.compat.v1._env import Env, Episode
from vfray.compat.v1._hooks import boundary, invoke
from vfray.compat.v1._judges import judge, plugged_judges
from vfray.compat.v1._kinds import of
from vfray.compat.v1._seated import EpisodeBridge, bridge_for, runs_itself, seats_of
from vfray.compat.v1._task import Task as V1Task
from vfray.compat.v1._toolsets import is_genuine_toolset, serve, shared_toolset
from vfray.compat.v1._trace import Trace as V1Trace
from vfray.compat.v1._trace import TraceTask, last_response, request_of
from vfray.compat.v1._types import Request, Response, RuntimeView
from vfray.errors import ConfigError, TaskError
from vfray.harnesses.seats import Ask, Game, Seat, SeatedTask
from vfray.interception.sessions import PENDING_REQUEST
from vfray.task import Artifact, Task, TaskData, TaskResources, TaskTimeout
from vfray.taskset import Taskset
from vfray.tools.toolset import Toolset as VfrayToolset
from vfray.trace import StopCondition, Trace

ENV_FINALIZE = "v1_env_finalize"
"""The group hook that runs a v1 env's ``finalize`` (weight 0: it only marks that it ran)."""

# v1 runs metrics before rewards; stops from the previous reply before the next call's.
_PRIORITY = {"metric": 1, "reward": 0}
_STOP_PRIORITY = {"response": 3, "trace": 2, "request": 1}


class V1Row(TaskData):
    """A v1 row as vfray's task data: the fields vfray acts on, plus the v1 row itself."""

    v1_type: str
    """The v1 Task class, ``module:Qualname``."""
    v1_data: dict[str, Any]


def to_row(data: V1TaskData, task_type: type | None = None) -> V1Row:
    where = f"v1 task {data.name or data.idx}"
    if data.skills or data.agent_user:
        raise ConfigError(f"{where}: TaskData.skills / agent_user are not supported by vfray yet")
    artifacts = []
    for artifact in data.artifacts:
        if artifact.exclude:
            raise ConfigError(f"{where}: artifact {artifact.source!r} has exclude patterns")
        artifacts.append(Artifact(path=artifact.source, required=artifact.required))
    prompt = data.prompt
    if isinstance(prompt, list):
        prompt = [m if isinstance(m, dict) else m.model_dump(exclude_none=True) for m in prompt]
    resources = data.resources.model_dump(exclude_none=True)
    cls = task_type or type(data)
    return V1Row(
        prompt=prompt,
        system_prompt=data.system_prompt,
        image=data.image,
        workdir=data.workdir,
        network_allow=list(data.network_allow),
        network_block=list(data.network_block),
        artifacts=artifacts,
        timeout=TaskTimeout(**data.timeout.model_dump()),
        resources=TaskResources(**resources),
        v1_type=f"{cls.__module__}:{cls.__qualname__}",
        v1_data=data.model_dump(mode="json", exclude_none=True),
    )


class AdaptedTask(Task[V1Row]):
    """One v1 task under vfray; subclasses made by :func:`adapted_class` carry its hooks."""

    v1_shared: tuple[Any, ...] = ()
    """The taskset's shared toolsets (``Taskset.toolsets``), served once for the run."""
    v1_env_blob: ClassVar[bytes | None] = None
    seat: str | None = None

    def __init__(self, task: V1Task[Any, Any, Any]) -> None:
        super().__init__(to_row(task.data, type(task)), key=task.key)
        self.v1 = task

    # -- process boundaries: the v1 task's module imports verifiers.v1 --------------------------

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["v1"] = cloudpickle.dumps(self.v1)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        from vfray.compat.v1._alias import install

        install()
        state["v1"] = cloudpickle.loads(state["v1"])
        self.__dict__.update(state)

    # -- lifecycle ------------------------------------------------------------------------------

    def view(self, trace: Trace) -> V1Trace:
        data = self.v1.data
        kind = f"{type(data).__module__}:{type(data).__qualname__}"
        return V1Trace(trace, TraceTask(type=kind, data=data, key=self.v1.key, hash=self.v1.hash))

    async def setup(self, trace: Trace, runtime: Any) -> None:
        await _call(self.v1.setup, {"trace": self.view(trace), "runtime": RuntimeView(runtime)})

    async def finalize(self, trace: Trace, runtime: Any) -> None:
        await self._late_response_stop(trace)
        await _call(self.v1.finalize, {"trace": self.view(trace), "runtime": RuntimeView(runtime)})

    async def validate(self, runtime: Any) -> None:
        verdict = await _call(self.v1.validate, {"runtime": RuntimeView(runtime)})
        if verdict is False:
            raise TaskError(f"v1 task {self.v1.key[:12]}: validate returned False")

    async def _late_response_stop(self, trace: Trace) -> None:
        """A response stop fires in v1 before the reply is delivered; here it is checked before
        the next call, so the reply that ended the agent is checked once it has ended."""
        if trace.stop_condition not in (None, StopCondition.COMPLETED):
            return
        for fn in self.v1.hooks("stop"):
            if boundary(fn) == "response" and await self._stop(fn, trace, "response"):
                trace.stop_condition = StopCondition.STOP_HOOK
                trace.notes.append(f"stop hook {fn.__name__!r} ended the rollout")
                return

    # -- hooks ----------------------------------------------------------------------------------

    def _hook(self, attr: str, name: str) -> Callable[..., Any] | None:
        for fn in self.v1.hooks(attr):
            if fn.__name__ == name:
                return fn
        if self.seat is not None:  # this seat plays another v1 task (a user): not its hook
            return None
        raise LookupError(f"v1 {attr} {name!r} is gone from the task")

    async def _score(self, attr: str, name: str, trace: Trace, runtime: Any) -> Any:
        fn = self._hook(attr, name)
        if fn is None:
            return None
        available: dict[Any, Any] = {"task": self.v1.data, "trace": self.view(trace)}
        if runtime is not None:
            available["runtime"] = RuntimeView(runtime)
        return await _call(fn, available)

    async def _stop(self, fn: Callable[..., Any], trace: Trace, where: str) -> bool:
        available: dict[Any, Any] = {V1Trace: self.view(trace)}
        if where == "request":
            pending = PENDING_REQUEST.get()
            if pending is None:
                return False
            available[Request] = request_of(list(pending.parsed.messages), pending.parsed.tools)
        elif where == "response":
            response = last_response(trace)
            if response is None:
                return False
            available[Response] = response
        result = await _call(fn, available)
        if not isinstance(result, bool):
            raise TypeError(f"@stop must return bool, got {type(result).__name__}")
        return result

    async def _env_finalize(self, traces: list[Trace]) -> list[float]:
        env = self.v1_env()
        assert env is not None
        wanted = getattr(env.config, "n", None)
        if isinstance(env, of(env).BestOfNEnv) and wanted != len(traces):
            raise ValueError(f"{type(env).__name__} compares n={wanted} attempts; run -r {wanted}")
        views = [self.view(t) for t in traces]
        await env.finalize(self.v1, Episode(ok=all(t.ok for t in traces), traces=views))
        return [0.0] * len(traces)

    @classmethod
    def v1_env(cls) -> Env[Any] | None:
        blob = cls.v1_env_blob
        return None if blob is None else _load_env(blob)


class AdaptedSeatedTask(AdaptedTask, SeatedTask[V1Row]):
    """A v1 task under an env with its own ``run()``: the env's agents are the seats, its
    ``run`` the game (:mod:`vfray.compat.v1._seated`); each seat scores the v1 task it played."""

    def _bridge(self, game: Game) -> EpisodeBridge:
        env = self.v1_env()
        assert env is not None
        return bridge_for(game, env, self.v1)

    def seats(self) -> list[Seat]:
        env = self.v1_env()
        assert env is not None
        return seats_of(env)

    async def play(self, game: Game, ask: Ask) -> None:
        await self._bridge(game).play(ask)

    async def setup(self, trace: Trace, runtime: Any) -> None:
        if self.game is not None and self.seat is not None:
            episode = self._bridge(self.game)
            played = episode.tasks.get(self.seat)
            if played is not None:  # the task its interaction was opened with, and its prompt
                self.v1 = played
                # Scored by that task's own hooks, as v1 scores each trace (proposer_solver's
                # solvers play a SolveTask minted from the proposer's trace): this seat's copy
                # takes the adapted class of the task it played.
                own = _class_for(played, self.v1_env_blob)
                if own is not type(self):
                    self.__class__ = own  # type: ignore[assignment]
                prompt = played.data.system_prompt
                self.data = self.data.model_copy(update={"system_prompt": prompt})
            episode.started.add(self.seat)
            episode.views[self.seat] = self.view(trace)
        await super().setup(trace, runtime)

    async def finalize(self, trace: Trace, runtime: Any) -> None:
        await super().finalize(trace, runtime)
        if self.game is not None:
            self._bridge(self.game).game_over()

    @scoring.reward(weight=0.0, priority=_PRIORITY["reward"] - 10)
    async def v1_env_finalize(self, trace: Trace) -> float:
        """The env's ``finalize`` over every seat's trace, after their own scoring (as v1 runs
        it, so it reads their rewards and metrics): each seat's last scoring hook reports in,
        the last one runs it (weight 0; not in the v1 view or export)."""
        if self.game is not None and self.seat is not None:
            await self._bridge(self.game).seat_ended(self.seat, self.view(trace), self.game)
        return 0.0


@functools.cache
def _load_env(blob: bytes) -> Env[Any]:
    env: Env[Any] = cloudpickle.loads(blob)
    return env


async def _call(fn: Callable[..., Any], available: dict[Any, Any]) -> Any:
    """v1's ``invoke``: async hooks on the loop, sync ones on vfray's hook threads."""
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__wrapped__", None)
    ):
        return await invoke(fn, available)
    result = await run_in_hook_thread(invoke, fn=fn, available=available)
    return await result if inspect.isawaitable(result) else result


def _needs_runtime(fn: Callable[..., Any]) -> bool:
    return "runtime" in inspect.signature(fn).parameters


def _score_method(attr: str, name: str, runtime: bool) -> Callable[..., Any]:
    if runtime:

        async def with_runtime(self: AdaptedTask, trace: Trace, runtime: Any) -> Any:
            return await self._score(attr, name, trace, runtime)

        return with_runtime

    async def without_runtime(self: AdaptedTask, trace: Trace) -> Any:
        return await self._score(attr, name, trace, None)

    return without_runtime


def _judge_method(index: int) -> Callable[..., Any]:
    async def judged(self: AdaptedTask, trace: Trace) -> float | None:
        judges = plugged_judges(self.v1.config)
        if index >= len(judges):  # a seat playing another v1 task (a user): not its judge
            return None
        return await judge(judges[index], self.v1.data, trace)

    return judged


def _stop_method(name: str, where: str) -> Callable[..., Any]:
    async def check(self: AdaptedTask, trace: Trace) -> bool:
        fn = self._hook("stop", name)
        return False if fn is None else await self._stop(fn, trace, where)

    return check


def _refuse_unsupported(task: V1Task[Any, Any, Any]) -> None:
    label = type(task).__qualname__
    ToolsetConfig = of(task).ToolsetConfig  # verifiers' own, when installed
    for toolset in type(task).toolsets(task.config):
        if is_genuine_toolset(toolset):
            serve(toolset)  # refuses what it cannot serve, in one line
        elif not isinstance(toolset, VfrayToolset):
            raise ConfigError(
                f"v1 task {label}: toolset {type(toolset).__qualname__} is not a verifiers.v1 "
                "Toolset (vfray hosts a Toolset's @tool methods)"
            )
        config = getattr(toolset, "config", None)
        if isinstance(config, ToolsetConfig):
            # Compared as dumped: verifiers' own default runtime is a model, not a dict.
            keys = {"colocated", "runtime", "url"}
            default = ToolsetConfig().model_dump(include=keys)
            asked = [
                f"{k}={v!r}" for k, v in config.model_dump(include=keys).items() if v != default[k]
            ]
            if asked:
                raise ConfigError(
                    f"v1 task {label}: toolset {type(toolset).__qualname__} config "
                    f"{', '.join(asked)} is not supported (vfray serves a task's toolsets on "
                    "the host, per rollout)"
                )
    intercepts = [
        n for k in type(task).__mro__ for n, f in vars(k).items() if hasattr(f, "intercept")
    ]
    if intercepts:
        raise ConfigError(
            f"v1 task {label}: @intercept hooks ({', '.join(intercepts)}) are not supported "
            "(vfray's @vf.intercept rewrites tool results, not model requests / responses)"
        )


def adapted_class(task: V1Task[Any, Any, Any], env: Env[Any] | None = None) -> type[AdaptedTask]:
    """The vfray Task class for v1 tasks of this type, config and env."""
    return _class_for(task, _env_blob(env))


def _env_blob(env: Env[Any] | None) -> bytes | None:
    return cloudpickle.dumps(env) if env is not None else None


def _class_for(
    task: V1Task[Any, Any, Any], env_blob: bytes | None, shared: bool = False
) -> type[AdaptedTask]:
    return _adapted_class(type(task), task.config.model_dump_json(), env_blob, task, shared)


_CLASSES: dict[tuple[type, str, bytes | None, bool], type[AdaptedTask]] = {}


def _adapted_class(
    cls: type,
    config: str,
    env_blob: bytes | None,
    task: V1Task[Any, Any, Any],
    shared: bool = False,
) -> type[AdaptedTask]:
    found = _CLASSES.get((cls, config, env_blob, shared))
    if found is not None:
        return found
    _refuse_unsupported(task)
    body: dict[str, Any] = {"v1_env_blob": env_blob, "__module__": __name__}
    for attr in ("metric", "reward"):
        for fn in task.hooks(attr):
            method = _score_method(attr, fn.__name__, _needs_runtime(fn))
            if attr == "metric":
                mark = scoring.metric(priority=_PRIORITY[attr])
            else:
                mark = scoring.reward(
                    weight=getattr(fn, "_vf_weight", 1.0), priority=_PRIORITY[attr]
                )
            body[fn.__name__] = mark(method)
    for index, plugged in enumerate(plugged_judges(task.config)):
        if plugged.name in body:
            raise ConfigError(f"v1 task {cls.__qualname__}: judge {plugged.name!r} names a reward")
        # v1 scores plugged judges after the task's own rewards.
        mark = scoring.reward(weight=plugged.weight, priority=_PRIORITY["reward"] - 1)
        body[plugged.name] = mark(_judge_method(index))
    for fn in task.hooks("stop"):
        where = boundary(fn)
        body[fn.__name__] = scoring.stop(priority=_STOP_PRIORITY[where])(
            _stop_method(fn.__name__, where)
        )
    if shared or type(task).toolsets(task.config):

        def toolsets(self: AdaptedTask) -> list[Any]:
            made = type(self.v1).toolsets(self.v1.config)
            own = [serve(t) if is_genuine_toolset(t) else t for t in made]
            return [*own, *self.v1_shared]  # the taskset's, one instance for the run

        body["toolsets"] = toolsets
    env = None if env_blob is None else _load_env(env_blob)
    seated = env is not None and runs_itself(env)  # its finalize runs once the game is over
    base = AdaptedSeatedTask if seated else AdaptedTask
    if env is not None and not seated and type(env).finalize is not of(env).Env.finalize:

        async def v1_env_finalize(self: AdaptedTask, traces: list[Trace]) -> list[float]:
            return await self._env_finalize(traces)

        body[ENV_FINALIZE] = scoring.group_reward(weight=0.0)(v1_env_finalize)
    made = type(f"V1{cls.__name__}", (base,), body)
    _CLASSES[(cls, config, env_blob, shared)] = made
    return made


class AdaptedTaskset(Taskset[AdaptedTask]):
    """A v1 taskset (views and all) iterated as vfray tasks."""

    task_class = AdaptedTask

    def __init__(
        self,
        v1: Any,
        env: Env[Any] | None = None,
        name: str | None = None,
        shared: list[Any] | None = None,
    ) -> None:
        self.v1 = v1
        self.env_blob = _env_blob(env)
        self.shared = [shared_toolset(t) for t in shared or []]
        self.INFINITE = not v1.bounded  # type: ignore[misc]
        self.name = name or (getattr(v1.config, "id", "") or type(v1).__name__).replace("-", "_")

    @property
    def is_infinite(self) -> bool:
        return not self.v1.bounded

    def load(self) -> Iterator[AdaptedTask]:
        for task in self.v1:
            made = _class_for(task, self.env_blob, bool(self.shared))(task)
            made.v1_shared = tuple(self.shared)
            yield made

    @property
    def task_type(self) -> type[Task[Any]]:
        first = next(iter(self.v1), None)
        return AdaptedTask if first is None else _class_for(first, self.env_blob, bool(self.shared))


def adapt(tasks: Any, env: Env[Any] | None = None) -> Taskset[Any]:
    """A vfray taskset running the v1 taskset ``tasks`` (or any iterable of v1 tasks)."""
    if hasattr(tasks, "load") and hasattr(tasks, "bounded"):
        return AdaptedTaskset(tasks, env)
    return _Listed(list(tasks), env)


class _Listed(Taskset[AdaptedTask]):
    def __init__(self, tasks: list[Any], env: Env[Any] | None) -> None:
        self.items, self.env_blob = tasks, _env_blob(env)
        self.name = "v1_tasks"

    def load(self) -> Iterable[AdaptedTask]:
        return [_class_for(t, self.env_blob)(t) for t in self.items]

    @property
    def task_type(self) -> type[Task[Any]]:
        return _class_for(self.items[0], self.env_blob) if self.items else AdaptedTask
