"""The legacy bridge: a classic verifiers environment (a package whose ``load_environment(**args)``
returns a ``SingleTurnEnv``, ``MultiTurnEnv`` or ``ToolEnv``, as ``verifiers.load_environment(id,
**args)`` loads it) run as a vfray taskset, scored as verifiers scores it.

- Each row of the env's eval dataset (its train dataset when it has none, as verifiers falls
  back) is one task: the row itself is the task's data, its formatted ``prompt`` the prompt.
- The rollout is verifiers' own: the ``legacy`` harness (:class:`LegacyHarness`) runs the
  env's genuine ``rollout`` loop (its ``env_response``, ``is_completed`` and stop conditions,
  a ToolEnv's python-function tools and their tool messages) in the host's process, with its
  model client pointed at the rollout's interception, so every model call is recorded, limited
  and trained on as any harness's. After scoring, its tool calls go on ``trace.tool_calls``
  and verifiers' stop condition in a note.
- Scoring is verifiers' own too: each reward function of the env's rubric is a vfray reward of
  the same name and weight (weight 0: a metric), and all of them are computed once, in the
  scoring phase, by the genuine rubric's ``score_rollout`` on the rollout's classic state (its
  parser, sync or async functions, a raising one scoring 0 as in verifiers). ``trace.reward``
  is then verifiers' ``reward``.

The classic classes exist only in verifiers' classic stack (``verifiers<0.4``: 0.4.0 ships v1
alone), so the bridge needs it installed; without it, the package's first classic class fails
and is reported in one line saying so. Refused in one line, naming what: group reward
functions, two functions of one name, an ``EnvGroup`` or an env without a ``rollout`` loop, and
a runtime other than ``subprocess`` (the loop runs beside the box, not in it).

Internal: importable, but not the public API."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, ClassVar

from vfray.errors import ConfigError, HarnessError, TaskError
from vfray.harnesses.base import Harness, LaunchContext
from vfray.harnesses.chat import openai_base_url
from vfray.runtimes.base import ProgramResult, Runtime
from vfray.scoring import metric, reward
from vfray.task import Task, TaskData
from vfray.taskset import Taskset
from vfray.trace import ToolCall, Trace

HARNESS = "vfray.compat.v1._legacy:LegacyHarness"
"""The harness id (an import path) a classic env's run uses; ``vfray eval`` sets it."""

_ENVS: dict[str, Any] = {}
"""Classic envs loaded in this process, by (module, args): one per process, as verifiers
loads one per eval."""
_ROLLOUTS: dict[int, _Rollout] = {}
"""A rollout's classic state, by its runtime's id: the harness leaves it, the rewards read it,
the harness's cleanup drops it (teardown, always)."""


def is_legacy(module: ModuleType) -> bool:
    """Whether ``module`` is a classic environment package: it has ``load_environment`` and
    exports no v1 ``Taskset`` subclass (told by name: verifiers' v1 or vfray's layer)."""
    if not callable(getattr(module, "load_environment", None)):
        return False
    exported = [getattr(module, n, None) for n in getattr(module, "__all__", [])]
    return not any(
        isinstance(c, type) and any(b.__name__ == "Taskset" for b in c.__mro__[1:])
        for c in exported
    )


class LegacyData(TaskData):
    """One row of a classic env's dataset, and where its env comes from."""

    row: dict[str, Any]
    """The dataset row as verifiers' rollout takes it (``prompt``, ``answer``, ``info``, ...)."""
    env_module: str
    """The module whose ``load_environment`` builds the env, imported by name."""
    env_args: dict[str, Any] = {}


def _key(module: str, args: Mapping[str, Any]) -> str:
    return json.dumps([module, dict(args)], sort_keys=True, default=str)


def classic_env(module: ModuleType | str, args: Mapping[str, Any]) -> Any:
    """The env ``module.load_environment(**args)`` builds, once per process, checked."""
    import importlib

    name = module if isinstance(module, str) else module.__name__
    key = _key(name, args)
    if key not in _ENVS:
        mod = importlib.import_module(module) if isinstance(module, str) else module
        try:
            with _signals_left_alone():
                env = mod.load_environment(**dict(args))
        except Exception as exc:
            raise ConfigError(
                f"classic env {name!r}: load_environment failed: {type(exc).__name__}: {exc}"
                + NO_CLASSIC * (not _classic_installed())
            ) from None
        _check(name, env)
        _ENVS[key] = env
    return _ENVS[key]


@contextlib.contextmanager
def _signals_left_alone() -> Iterator[None]:
    """verifiers' ``Environment`` installs SIGINT/SIGTERM handlers (its teardown) when built,
    which Python allows only on the main thread: a Ray actor builds it on its loop's thread
    (measured: "signal only works in main thread"). There the handlers are not installed (the
    worker keeps Ray's own); on the main thread they are, as in verifiers."""
    if threading.current_thread() is threading.main_thread():
        yield
        return
    original = signal.signal
    signal.signal = lambda sig, handler: signal.getsignal(sig)  # type: ignore[assignment]
    try:
        yield
    finally:
        signal.signal = original


NO_CLASSIC = (
    " (verifiers' classic stack is not installed here: verifiers 0.4.0 ships v1 alone; "
    "0.3.1 has SingleTurnEnv, ToolEnv, ...)"
)


def _classic_installed() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("verifiers.legacy") is not None
    except (ImportError, ValueError):  # vfray's shim, or no verifiers at all
        return False


def _check(name: str, env: Any) -> None:
    what = type(env).__name__
    if any(k.__name__ == "EnvGroup" for k in type(env).__mro__):
        raise ConfigError(
            f"classic env {name!r}: an EnvGroup is not supported by vfray's legacy bridge (its "
            "rows route to sub-envs, each with its own rubric): run each env on its own"
        )
    if not callable(getattr(env, "rollout", None)) or getattr(env, "rubric", None) is None:
        raise ConfigError(
            f"classic env {name!r}: a {what} is not supported by vfray's legacy bridge (it runs "
            "envs with their own rollout loop and rubric: SingleTurnEnv, MultiTurnEnv, ToolEnv)"
        )
    rubric = env.rubric
    group = [f for f in rubric._get_reward_funcs() if rubric._is_group_func(f)]
    if group:
        names = ", ".join(getattr(f, "__name__", repr(f)) for f in group)
        raise ConfigError(
            f"classic env {name!r}: group reward functions are not supported by vfray's legacy "
            f"bridge: {names}"
        )
    names = rubric._get_reward_func_names()
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(
            f"classic env {name!r}: its rubric has two reward functions named "
            f"{', '.join(twice)} (verifiers keeps one score per name)"
        )


def scores(env: Any) -> list[tuple[str, float]]:
    """The rubric's reward functions as (name, weight), in its order."""
    rubric = env.rubric
    return list(
        zip(rubric._get_reward_func_names(), map(float, rubric._get_reward_weights()), strict=True)
    )


@dataclass
class _Rollout:
    env: Any
    state: Any
    scoring: asyncio.Future[None] | None = field(default=None)


async def _score(runtime: Runtime, name: str) -> dict[str, float | None]:
    """``name``'s score from the genuine rubric, which scores the rollout once for all."""
    entry = _ROLLOUTS.get(id(runtime))
    if entry is None:
        raise TaskError(
            "no classic rollout to score: a classic env's tasks run with the legacy harness "
            f"({HARNESS})"
        )
    if entry.state is None:
        raise TaskError(
            "verifiers' rollout loop did not finish (the agent's time ran out): its rubric has "
            "no state to score"
        )
    if entry.scoring is None:
        entry.scoring = asyncio.ensure_future(_run_rubric(entry))
    await asyncio.shield(entry.scoring)
    value = (entry.state.get("metrics") or {}).get(name)
    return {name: None if value is None else float(value)}


async def _run_rubric(entry: _Rollout) -> None:
    # What verifiers' run_rollout does once its rollout loop ends.
    rubric = entry.env.rubric
    if getattr(entry.env, "score_rollouts", True):
        await rubric.score_rollout(entry.state)
    else:
        await rubric.dummy_score_rollout(entry.state)
    await rubric.cleanup(entry.state)


class LegacyTask(Task[LegacyData]):
    """A classic env's row; its rewards are added per env (:func:`task_class`)."""


def _hook(name: str) -> Any:
    async def hook(self: LegacyTask, runtime: Runtime) -> dict[str, float | None]:
        return await _score(runtime, name)

    hook.__name__ = name
    return hook


def task_class(env_name: str, funcs: list[tuple[str, float]]) -> type[LegacyTask]:
    """A :class:`LegacyTask` with one reward per weighted function, one metric per weight-0
    function, each keyed by the function's name."""
    attrs: dict[str, Any] = {}
    for i, (name, weight) in enumerate(funcs):
        fn = _hook(name)
        # The hook's own name is the function's where it can be (errors name the hook).
        attr = name if name.isidentifier() and not hasattr(LegacyTask, name) else f"legacy_{i}"
        if weight:
            attrs[attr] = reward(weight=weight, keys=(name,))(fn)
        else:
            attrs[attr] = metric(keys=(name,))(fn)
    return type(f"LegacyTask_{env_name}", (LegacyTask,), attrs)


def _jsonable(row: Mapping[str, Any]) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(json.dumps(dict(row), default=str))
    return data


class LegacyTaskset(Taskset[LegacyTask]):
    """A classic env's eval rows as tasks (:mod:`._legacy`)."""

    def __init__(self, module: ModuleType, args: Mapping[str, Any], name: str) -> None:
        self.module_name = module.__name__
        self.args = dict(args)
        self.name = name
        env = classic_env(module, self.args)
        self._type = task_class(name, scores(env))
        self._rows = [_jsonable(r) for r in _dataset(env)]

    @property
    def task_type(self) -> type[Task[Any]]:
        return self._type

    def load(self) -> Iterator[LegacyTask]:
        for index, row in enumerate(self._rows):
            prompt = row.get("prompt")
            data = LegacyData(
                prompt=prompt if isinstance(prompt, str | list) else None,
                row=row,
                env_module=self.module_name,
                env_args=self.args,
            )
            key = str(row.get("example_id", index))
            yield self._type(data, key=key)


def _dataset(env: Any) -> Any:
    try:
        return env.get_eval_dataset()
    except ValueError:  # no dataset at all: verifiers' own one line
        return env.get_dataset()


class LegacyHarness(Harness):
    """Runs the classic env's own rollout loop beside the box, its model calls through the
    rollout's interception."""

    id = "legacy"
    SUPPORTS_MCP = False
    SUPPORTS_RESUME = False
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False
    RUNTIMES: ClassVar[tuple[str, ...]] = ("subprocess",)

    def preflight(self, runtime_type: str) -> None:
        if runtime_type not in self.RUNTIMES:
            raise ConfigError(
                f"the legacy harness runs a classic verifiers env's loop in the host's process, "
                f"beside the box: use --env.agent.runtime.type subprocess (got {runtime_type!r})"
            )

    async def launch(self, ctx: LaunchContext, runtime: Runtime) -> ProgramResult:
        data = ctx.data
        if not isinstance(data, LegacyData):
            raise HarnessError(
                f"the legacy harness runs classic verifiers envs' tasks, got {type(data).__name__}"
            )
        from openai import AsyncOpenAI

        env = classic_env(data.env_module, data.env_args)
        client_type = _client_type()
        api = AsyncOpenAI(base_url=openai_base_url(ctx.endpoint), api_key=ctx.secret)
        client = client_type(api)
        loop = asyncio.get_running_loop()
        start = loop.time()
        try:
            state = await asyncio.wait_for(
                env.rollout(dict(data.row), client, ctx.model, {}), ctx.timeout
            )
        except TimeoutError:
            # verifiers' state stays inside its cancelled loop: nothing for the rubric.
            _ROLLOUTS[id(runtime)] = _Rollout(env, None)
            return ProgramResult(exit_code=124, timed_out=True, duration=loop.time() - start)
        except asyncio.CancelledError:  # the agent phase's own deadline: the same, said so
            _ROLLOUTS[id(runtime)] = _Rollout(env, None)
            raise
        finally:
            await api.close()
        _ROLLOUTS[id(runtime)] = _Rollout(env, state)
        error = state.get("error")
        summary = {"stop_condition": state.get("stop_condition"), "turns": len(state["trajectory"])}
        # An error verifiers caught in its loop (a failed model call, a vf.Error) ends its
        # rollout, which it still scores: vfray records it as the harness's error.
        return ProgramResult(
            exit_code=0 if error is None else 1,
            stdout=json.dumps(summary),
            stderr="" if error is None else f"{type(error).__name__}: {error}",
            duration=loop.time() - start,
        )

    async def score(self, trace: Trace, runtime: Runtime) -> Mapping[str, float | None]:
        """After the rubric: what verifiers' state says that a vfray trace keeps elsewhere: each
        python-function tool call on ``trace.tool_calls`` (server ``legacy``; verifiers times
        none), and verifiers' stop condition as a note (vfray's says the harness completed)."""
        entry = _ROLLOUTS.get(id(runtime))
        if entry is None or entry.state is None:
            return {}
        stop = entry.state.get("stop_condition")
        if stop:
            trace.notes.append(f"verifiers' stop condition: {stop}")
        trace.tool_calls.extend(_tool_calls(entry.state.get("completion") or []))
        return {}

    async def cleanup(self, runtime: Runtime) -> None:
        _ROLLOUTS.pop(id(runtime), None)


def _field(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, Mapping) else getattr(obj, name, None)


def _tool_calls(completion: list[Any]) -> list[ToolCall]:
    """The tool calls of a classic completion, each with the tool message that answered it."""
    results = {
        _field(m, "tool_call_id"): _field(m, "content")
        for m in completion
        if _field(m, "role") == "tool"
    }
    calls = []
    for message in completion:
        for raw in _field(message, "tool_calls") or []:
            call = json.loads(raw) if isinstance(raw, str) else raw
            try:
                arguments = json.loads(_field(call, "arguments") or "{}")
            except ValueError:
                arguments = {"_raw": _field(call, "arguments")}
            result = results.get(_field(call, "id"))
            calls.append(
                ToolCall(
                    server="legacy",
                    name=str(_field(call, "name") or ""),
                    arguments=arguments if isinstance(arguments, dict) else {"_raw": arguments},
                    result=None if result is None else str(result),
                )
            )
    return calls


def _client_type() -> Any:
    import importlib

    try:
        return importlib.import_module("verifiers").OpenAIChatCompletionsClient
    except (ImportError, AttributeError) as exc:
        raise HarnessError(
            f"the legacy harness needs verifiers' classic stack (verifiers<0.4): {exc}"
        ) from None
