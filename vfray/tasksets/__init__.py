"""Built-in tasksets and taskset lookup: a built-in id (``arithmetic``), an installed entry
point (group ``vfray.tasksets``), ``package.module:Class`` or ``path/to/file.py:Class``."""

from __future__ import annotations

import difflib
from importlib.metadata import entry_points
from typing import Any

from vfray.errors import ConfigError
from vfray.plugins import load_object
from vfray.taskset import Taskset

BUILTINS: dict[str, str] = {
    "arithmetic": "vfray.tasksets.arithmetic:ArithmeticTaskset",
    "arithmetic-endless": "vfray.tasksets.arithmetic:EndlessArithmetic",
}
ENTRY_POINT_GROUP = "vfray.tasksets"


def known_tasksets() -> dict[str, str]:
    found = dict(BUILTINS)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(ep.name, ep.value)
    return found


def load_taskset(spec: str, args: dict[str, Any] | None = None) -> Taskset[Any]:
    """Build the taskset ``spec`` names, passing ``args`` to its constructor (or factory)."""
    known = known_tasksets()
    target = known.get(spec)
    if target is None:
        if ":" not in spec:
            near = difflib.get_close_matches(spec, known, n=3)
            hint = f" Did you mean: {', '.join(near)}?" if near else ""
            raise ConfigError(
                f"unknown taskset {spec!r}.{hint} Known: {', '.join(sorted(known))}; or give "
                "'package.module:Class' or 'path/to/file.py:Class'."
            )
        target = spec
    factory = load_object(target)
    try:
        taskset = factory(**(args or {}))
    except TypeError as exc:
        raise ConfigError(f"cannot build taskset {spec!r} with {args or {}}: {exc}") from exc
    if not isinstance(taskset, Taskset):
        raise ConfigError(f"{spec!r} built a {type(taskset).__name__}, not a vfray Taskset")
    return taskset
