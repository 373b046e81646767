"""Scoring hooks: the ``@reward``, ``@metric``, ``@stop`` and ``@group_reward`` decorators (what
they mark is :mod:`vfray._hook_marks`), their discovery on a Task class (or plugged in from
config by import path), and their execution.

Hooks get their arguments injected by parameter name, may be sync or async, and run concurrently
within a priority level (higher priority levels run first). A failed or skipped hook still leaves
its keys in the result with value ``None`` and the reason recorded, so a missing score is visible.

Internal: importable, but not the public API (:mod:`vfray`, :mod:`vfray.testing`,
:mod:`vfray.train`, :mod:`vfray.compat.v1`); names here may move.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
from collections.abc import Callable, Iterable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeAlias

from vfray._hook_calls import run_levels
from vfray._hook_marks import HOOK_ATTR as HOOK_ATTR
from vfray._hook_marks import HookKind as HookKind
from vfray._hook_marks import HookSpec as HookSpec
from vfray._hook_marks import group_reward as group_reward
from vfray._hook_marks import metric as metric
from vfray._hook_marks import reward as reward
from vfray._hook_marks import stop as stop
from vfray._plugins import load_object
from vfray.errors import ConfigError, JudgeError, PhaseTimeoutError, TaskError
from vfray.task import Task
from vfray.trace import RewardRecord, StopCondition, Trace

PENDING_BODY: ContextVar[dict[str, Any] | None] = ContextVar("vfray_pending_body", default=None)
"""The JSON body of the model call being admitted, while ``@stop`` hooks run on it (set by the
interception, which sits above the task model: the hooks read it as ``request``)."""

Overrides: TypeAlias = Mapping[str, str | Callable[..., Any]]
"""Hook name -> ``"pkg.mod:fn"``, ``"path/file.py:fn"`` or a callable."""

INJECTABLE: dict[HookKind, frozenset[str]] = {
    HookKind.REWARD: frozenset({"trace", "task", "runtime"}),
    HookKind.METRIC: frozenset({"trace", "task", "runtime"}),
    # Stop hooks run inside the interception before each model call, where no runtime exists;
    # they may see that call's body (``request``) and the model's last reply (``response``).
    HookKind.STOP: frozenset({"trace", "task", "request", "response"}),
    HookKind.GROUP_REWARD: frozenset({"traces", "task"}),
}
"""Parameter names each kind of hook may ask for."""


@dataclass(frozen=True)
class ScoringHook:
    """A discovered hook: a Task method (``func`` None, looked up by name) or a plugged function."""

    name: str
    spec: HookSpec
    params: tuple[str, ...]
    func: Callable[..., Any] | None = None
    source: str = ""

    @property
    def keys(self) -> tuple[str, ...]:
        return self.spec.keys or (self.name,)

    @property
    def priority(self) -> int:
        return self.spec.priority

    @property
    def needs_runtime(self) -> bool:
        return "runtime" in self.params


# -- discovery -----------------------------------------------------------------------------


def _unwrap(raw: Any) -> tuple[Callable[..., Any] | None, bool]:
    """The plain function behind a class attribute, and whether its first parameter is bound."""
    if isinstance(raw, staticmethod):
        return raw.__func__, False
    if isinstance(raw, classmethod):
        return raw.__func__, True
    if inspect.isfunction(raw):
        return raw, True
    if callable(raw) and isinstance(getattr(raw, HOOK_ATTR, None), HookSpec):
        return raw, False  # an object that is a hook itself (a vf.Judge), called as it is
    return None, False


def _injected_params(
    fn: Callable[..., Any], kind: HookKind, where: str, skip_first: bool
) -> tuple[str, ...]:
    allowed = INJECTABLE[kind]
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: cannot read its signature: {exc}") from exc
    names: list[str] = []
    for p in params[1:] if skip_first else params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.name in allowed:
            names.append(p.name)
        elif p.default is p.empty:
            raise ConfigError(
                f"{where}: parameter {p.name!r} cannot be injected; a {kind.value} hook "
                f"may take {', '.join(sorted(allowed))}"
            )
    return tuple(names)


def _check_unique_keys(hooks: Iterable[ScoringHook], owner: str) -> None:
    # Rewards and group rewards share trace.rewards, metrics have their own namespace.
    seen: dict[tuple[str, str], str] = {}
    for hook in (h for h in hooks if h.spec.kind is not HookKind.STOP):
        space = "metric" if hook.spec.kind is HookKind.METRIC else "reward"
        for key in hook.keys:
            other = seen.setdefault((space, key), hook.name)
            if other != hook.name:
                raise ConfigError(
                    f"{owner}: {space} key {key!r} is produced by {other} and {hook.name}"
                )


@functools.cache
def _class_hooks(cls: type) -> tuple[ScoringHook, ...]:
    # A subclass that redefines a hook's method without decorating it keeps the hook (with the
    # new body); setting the name to None removes it.
    specs: dict[str, HookSpec] = {}
    for klass in reversed(cls.__mro__):
        for name, raw in vars(klass).items():
            func, _ = _unwrap(raw)
            spec = getattr(func, HOOK_ATTR, None) if func is not None else None
            if isinstance(spec, HookSpec):
                specs[name] = spec
            elif raw is None:
                specs.pop(name, None)
    hooks = []
    for name, spec in specs.items():
        where = f"{cls.__qualname__}.{name}"
        func, bound = _unwrap(inspect.getattr_static(cls, name))
        if func is None:
            raise ConfigError(
                f"{where} is a {spec.kind.value} hook but is overridden by a non-function"
            )
        hooks.append(
            ScoringHook(name, spec, _injected_params(func, spec.kind, where, bound), None, where)
        )
    _check_unique_keys(hooks, cls.__qualname__)
    return tuple(hooks)


def scoring_hooks(task_cls: type, overrides: Overrides | None = None) -> list[ScoringHook]:
    """All hooks of ``task_cls`` (over its MRO), with config overrides applied.

    An override maps a hook name to ``"pkg.mod:fn"``, ``"path/file.py:fn"`` or a callable. It
    replaces the hook of that name (keeping its kind, weight and priority unless the function is
    itself decorated), or adds a new reward when no hook has that name.
    """
    hooks = {h.name: h for h in _class_hooks(task_cls)}
    for name, target in (overrides or {}).items():
        source = target if isinstance(target, str) else getattr(target, "__qualname__", "?")
        func = load_object(target) if isinstance(target, str) else target
        if not callable(func):
            raise ConfigError(f"scoring override {name!r}: {source!r} is not callable")
        own = getattr(func, HOOK_ATTR, None)
        fallback = hooks[name].spec if name in hooks else HookSpec(HookKind.REWARD)
        spec = own if isinstance(own, HookSpec) else fallback
        where = f"scoring override {name!r} ({source})"
        params = _injected_params(func, spec.kind, where, skip_first=False)
        hooks[name] = ScoringHook(name, spec, params, func, str(source))
    if overrides:
        _check_unique_keys(hooks.values(), task_cls.__qualname__)
    return list(hooks.values())


def validate_group_config(task_cls: type, n: int, overrides: Overrides | None = None) -> None:
    """Raise :class:`ConfigError` when ``task_cls`` has group rewards and ``n < 2``."""
    hooks = scoring_hooks(task_cls, overrides)
    group = [h.name for h in hooks if h.spec.kind is HookKind.GROUP_REWARD]
    if group and n < 2:
        raise ConfigError(
            f"{task_cls.__qualname__} has group rewards ({', '.join(group)}) which compare "
            f"the n rollouts of a task; n must be at least 2, got n={n} "
            "(set -r / rollouts_per_task)"
        )


# -- execution -----------------------------------------------------------------------------


def select_hooks(
    task: Task[Any], overrides: Overrides | None, *kinds: HookKind
) -> list[ScoringHook]:
    return [h for h in scoring_hooks(type(task), overrides) if h.spec.kind in kinds]


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def spread_keys(hook: ScoringHook, result: Any) -> dict[str, Any]:
    """Spread a hook's return (or exception) over its keys; a missing key becomes an error."""
    if isinstance(result, BaseException):
        return dict.fromkeys(hook.keys, result)
    if isinstance(result, Mapping):
        columns = {str(k): v for k, v in result.items()}
        if not columns and not hook.spec.keys:
            columns[hook.name] = ValueError("hook returned an empty mapping")
    elif hook.spec.keys and hook.spec.keys != (hook.name,):
        got = type(result).__name__
        return dict.fromkeys(hook.keys, TypeError(f"expected a mapping with keys, got {got}"))
    else:
        columns = {hook.name: result}
    for key in hook.spec.keys:
        columns.setdefault(key, LookupError(f"hook did not return key {key!r}"))
    return columns


def to_score(raw: Any) -> tuple[float | None, str | None]:
    """One score as (value, error): numbers and bools become floats, anything else an error."""
    if isinstance(raw, BaseException):
        return None, _describe(raw)
    if raw is None:
        return None, None
    if isinstance(raw, str | bytes) or not hasattr(raw, "__float__"):
        return None, f"TypeError: expected a number or bool, got {type(raw).__name__}"
    try:
        number = float(raw)
    except Exception as exc:  # 10**400 (OverflowError), a numpy array, a broken __float__
        return None, _describe(exc)
    if not math.isfinite(number):
        return None, f"ValueError: non-finite value {number}"
    return number, None


def store_score(
    trace: Trace, hook: ScoringHook, key: str, value: float | None, error: str | None
) -> None:
    if hook.spec.kind is HookKind.METRIC:
        trace.metrics[key] = value
    else:
        group = hook.spec.kind is HookKind.GROUP_REWARD
        trace.rewards[key] = RewardRecord(
            value=value, weight=hook.spec.weight, group=group, error=error
        )
    if error and hook.spec.kind is not HookKind.GROUP_REWARD:
        trace.notes.append(f"{hook.spec.kind.value} {key!r} ({hook.name}) has no value: {error}")


def _record_raise(trace: Trace, hook: ScoringHook, exc: BaseException) -> None:
    """A reward hook that raised is an error on the trace (phase ``scoring``), not only a note: a
    rollout whose reward is None because its code broke must not count as ok. It is the task's
    own code failing (a :class:`TaskError`, whatever it raised: a ``SandboxError`` from reading
    a file the agent never wrote is not the box failing), except a :class:`JudgeError`, which
    keeps its type. A metric that raised, or a value that is merely unscorable (a string, NaN),
    stays a note and the key's error: no reward is missing."""
    if hook.spec.kind is not HookKind.REWARD:
        return
    if isinstance(exc, JudgeError):
        trace.add_error(exc, "scoring")
    else:
        message = f"reward {hook.name} raised: {_describe(exc)}"
        trace.add_error(TaskError(message), "scoring")


def _skip(trace: Trace, hook: ScoringHook) -> None:
    # Offline re-scoring keeps a value recorded while the runtime was alive rather than erase it.
    reason = "skipped: needs a runtime and scoring ran without one"
    for key in hook.keys:
        old = (
            trace.metrics.get(key) if hook.spec.kind is HookKind.METRIC else trace.rewards.get(key)
        )
        if (old.value if isinstance(old, RewardRecord) else old) is None:
            store_score(trace, hook, key, None, reason)
        else:
            trace.notes.append(f"{hook.spec.kind.value} {key!r} {reason}; kept the recorded value")


async def score_rollout(
    task: Task[Any],
    trace: Trace,
    runtime: Any = None,
    overrides: Overrides | None = None,
    timeout: float | None = None,
) -> None:
    """Run the task's rewards and metrics on ``trace``, filling ``trace.rewards``/``metrics``.

    ``runtime=None`` means offline re-scoring: hooks that take ``runtime`` are skipped and noted.
    A hook still running after ``timeout`` seconds leaves its keys ``None`` and the trace a
    scoring :class:`PhaseTimeoutError`; the other hooks' values are kept.
    """
    hooks = select_hooks(task, overrides, HookKind.REWARD, HookKind.METRIC)
    if runtime is None:
        for hook in (h for h in hooks if h.needs_runtime):
            _skip(trace, hook)
        hooks = [h for h in hooks if not h.needs_runtime]
    available = {"trace": trace, "task": task, "runtime": runtime}
    late: list[str] = []
    async for level in run_levels(hooks, task, available, offload=True, timeout=timeout):
        for hook, result in level:
            if isinstance(result, PhaseTimeoutError):
                late.append(hook.name)
            elif isinstance(result, BaseException):
                _record_raise(trace, hook, result)
            for key, raw in spread_keys(hook, result).items():
                store_score(trace, hook, key, *to_score(raw))
    if late:
        message = f"scoring exceeded {timeout:g}s: {', '.join(late)} did not return"
        trace.add_error(PhaseTimeoutError(message), "scoring")
        trace.stop(StopCondition.TIMEOUT)
    if trace.reward is None and any(r.value is not None for r in trace.rewards.values()):
        trace.notes.append("reward has no value: the weighted sum is not a finite number")


STOP_TIMEOUT = 30.0
"""Default seconds the ``@stop`` hooks may take before each model call (``timeouts.stop``)."""


async def check_stop(
    task: Task[Any],
    trace: Trace,
    overrides: Overrides | None = None,
    timeout: float | None = STOP_TIMEOUT,
) -> str | None:
    """Run the ``@stop`` hooks; return the name of the first that says stop (truthy), else None.

    They run inside the interception before each model call; a hook may take ``request`` (the
    pending call's JSON body, None outside the interception) and ``response`` (the model's last
    reply as a :class:`~vfray.trace.Message`, None before the first). Sync ones run on the
    hooks' own bounded pool of threads (:mod:`vfray._hook_calls`): inline, one slow hook
    stalled every rollout served by the same loop (a 3 s hook made every rollout on the host
    take 60 s). A hook that raises is noted on the trace once and does not stop the rollout;
    so is one still running after ``timeout`` seconds, which is given up and not asked again in
    this rollout (without a deadline, a hung hook held the model call, and its rollout, until
    the agent's own timeout; asked again, it would cost the deadline on every call).
    """
    hooks = [
        h
        for h in select_hooks(task, overrides, HookKind.STOP)
        if timeout is None or _late_stop_note(h.name, timeout) not in trace.notes
    ]
    replies = [m for m in trace.messages if m.role == "assistant"] if trace.calls else []
    body = PENDING_BODY.get()
    values = {
        "trace": trace,
        "task": task,
        "request": body,
        "response": replies[-1] if replies else None,
    }
    levels = run_levels(hooks, task, values, offload=True, timeout=timeout)
    async with contextlib.aclosing(levels):  # closed promptly when a hook says stop
        async for level in levels:
            for hook, result in level:
                if isinstance(result, PhaseTimeoutError) and timeout is not None:
                    trace.notes.append(_late_stop_note(hook.name, timeout))
                elif isinstance(result, BaseException):
                    note = f"stop hook {hook.name!r} failed: {_describe(result)}"
                    if note not in trace.notes:
                        trace.notes.append(note)
                elif result:
                    return hook.name
    return None


def _late_stop_note(name: str, timeout: float) -> str:
    return (
        f"stop hook {name!r} did not return within {timeout:g}s (PhaseTimeoutError): "
        "taken as not stopping, and not asked again in this rollout"
    )
