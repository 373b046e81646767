"""Built-in tasksets and taskset lookup: a built-in id (``arithmetic``), an installed entry
point (group ``vfray.tasksets``), ``package.module:Class``, ``path/to/file.py:Class``, or
``harbor:PATH`` (Harbor task folders, :func:`harbor`).

Internal: importable, but not the public API (:mod:`vfray`, :mod:`vfray.testing`,
:mod:`vfray.train`, :mod:`vfray.compat.v1`); names here may move."""

from __future__ import annotations

from typing import Any

from vfray._plugins import Registry, options_model, validate_options
from vfray.errors import ConfigError, TasksetError, VfrayError
from vfray.scoring import HookKind, scoring_hooks
from vfray.task import Task
from vfray.taskset import Taskset

BUILTINS: dict[str, str] = {
    "arithmetic": "vfray.tasksets.arithmetic:ArithmeticTaskset",
    "arithmetic-endless": "vfray.tasksets.arithmetic:EndlessArithmetic",
}
ENTRY_POINT_GROUP = "vfray.tasksets"
HARBOR_PREFIX = "harbor:"


TASKSETS = Registry(
    "taskset",
    BUILTINS,
    group=ENTRY_POINT_GROUP,
    check=callable,
    example="path/to/file.py:Class",
)


def known_tasksets() -> dict[str, str]:
    return TASKSETS.targets()


def harbor(path: str) -> Taskset[Any]:
    """The Harbor tasks at ``path``: a task folder, a folder of them, or a local dataset
    manifest (:mod:`vfray.tasksets.harbor_tasks`)."""
    from vfray.tasksets.harbor_tasks import HarborTaskset

    return HarborTaskset(path)


def load_taskset(spec: str, args: dict[str, Any] | None = None) -> Taskset[Any]:
    """Build the taskset ``spec`` names, passing ``args`` to its constructor (or factory).
    A ``v1:`` spec is a verifiers v1 taskset package, built by :mod:`vfray.compat.v1`."""
    if spec.startswith("v1:"):
        from vfray.compat.v1.loader import load_from_args

        return load_from_args(spec, args or {})
    if spec.startswith(HARBOR_PREFIX):
        if args:
            raise ConfigError(f"taskset {spec!r} takes no arguments, got {sorted(args)}")
        return harbor(spec[len(HARBOR_PREFIX) :])
    factory = TASKSETS.load(spec)
    # Typed from its constructor, like harness and runtime options: a misspelt or mistyped
    # argument is one line naming it, before anything is built.
    typed = validate_options(options_model(factory), args, f"taskset {spec!r}")
    try:
        taskset = factory(**typed.as_kwargs())
    except TypeError as exc:
        raise ConfigError(f"cannot build taskset {spec!r} with {args or {}}: {exc}") from exc
    if not isinstance(taskset, Taskset):
        raise ConfigError(f"{spec!r} built a {type(taskset).__name__}, not a vfray Taskset")
    return taskset


def load_for_run(
    spec: str, args: dict[str, Any] | None, rollouts_per_task: int, scoring: dict[str, str]
) -> tuple[Taskset[Any], str | None]:
    """The taskset for a run, and a note to show when a default was adapted.

    A built-in taskset's group reward is an extra that must not make the defaults (one
    rollout per task) fail: with n < 2 it is left out, and the note says so. A user's own
    taskset, a built-in asked for ``group_rewards`` explicitly, or a group reward set in
    ``env.scoring`` is left as is, so n < 2 is still refused with the reason.
    """
    args = dict(args or {})
    if spec not in BUILTINS or rollouts_per_task >= 2 or "group_rewards" in args:
        return load_taskset(spec, args), None
    full = load_taskset(spec, args)
    group = [h.name for h in scoring_hooks(full.task_type) if h.spec.kind is HookKind.GROUP_REWARD]
    if not group or set(group) & set(scoring):
        return full, None
    note = (
        f"note: {spec}'s group reward {', '.join(group)} ranks the rollouts of a task against "
        f"each other, so it is left out with -r {rollouts_per_task}; use -r 2 or more to score it"
    )
    return load_taskset(spec, {**args, "group_rewards": False}), note


def task_type_of(taskset: Taskset[Any]) -> type[Task[Any]]:
    """``taskset.task_type`` for a run's up-front checks. A taskset that declares no Task class
    builds its first task to find it: a ``load()`` that fails there (a missing data file) is
    one line naming the taskset and the cause, not the user's traceback."""
    try:
        return taskset.task_type
    except VfrayError:
        raise
    except Exception as exc:
        raise TasksetError(
            f"taskset {taskset.name!r} failed building its first task: {type(exc).__name__}: {exc}"
        ) from exc
