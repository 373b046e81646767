"""What the scoring decorators put on a function: the ``@reward``, ``@metric``, ``@stop`` and
``@group_reward`` decorators (re-exported by :mod:`vfray.scoring` and :mod:`vfray`), the
:class:`HookSpec` each one attaches under :data:`HOOK_ATTR`, and the :class:`HookKind` it names.

Internal: importable, but not the public API; :mod:`vfray.scoring` discovers and runs the hooks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypeVar, overload

F = TypeVar("F", bound=Callable[..., Any])

HOOK_ATTR = "__vfray_hook__"
"""Attribute under which a decorated function carries its :class:`HookSpec`."""


class HookKind(str, Enum):
    REWARD = "reward"
    METRIC = "metric"
    STOP = "stop"
    GROUP_REWARD = "group_reward"


@dataclass(frozen=True)
class HookSpec:
    """What a decorator says about a hook: its kind, weight, priority and declared keys."""

    kind: HookKind
    weight: float = 1.0
    priority: int = 0
    keys: tuple[str, ...] = ()
    """Keys a mapping-returning hook promises; they are present even when the hook fails."""


# -- decorators ----------------------------------------------------------------------------


def _decorate(fn: Any, kind: HookKind, weight: float, priority: int, keys: Sequence[str]) -> Any:
    spec = HookSpec(kind, float(weight), int(priority), tuple(keys))

    def mark(f: Any) -> Any:
        target = f.__func__ if isinstance(f, staticmethod | classmethod) else f
        if not callable(target):
            raise TypeError(
                f"@vf.{kind.value} decorates a function; pass options by keyword, "
                f"e.g. @vf.{kind.value}(weight=0.5)"
            )
        setattr(target, HOOK_ATTR, spec)
        return f

    return mark if fn is None else mark(fn)


@overload
def reward(fn: F, /) -> F: ...
@overload
def reward(
    *, weight: float = 1.0, priority: int = 0, keys: Sequence[str] = ()
) -> Callable[[F], F]: ...
def reward(
    fn: Any = None, /, *, weight: float = 1.0, priority: int = 0, keys: Sequence[str] = ()
) -> Any:
    """Mark a Task method as a reward; ``trace.reward`` is the weighted sum of rewards."""
    return _decorate(fn, HookKind.REWARD, weight, priority, keys)


@overload
def metric(fn: F, /) -> F: ...
@overload
def metric(*, priority: int = 0, keys: Sequence[str] = ()) -> Callable[[F], F]: ...
def metric(fn: Any = None, /, *, priority: int = 0, keys: Sequence[str] = ()) -> Any:
    """Mark a Task method as a metric: recorded in ``trace.metrics``, not part of the reward."""
    return _decorate(fn, HookKind.METRIC, 0.0, priority, keys)


@overload
def stop(fn: F, /) -> F: ...
@overload
def stop(*, priority: int = 0) -> Callable[[F], F]: ...
def stop(fn: Any = None, /, *, priority: int = 0) -> Any:
    """Mark a Task method as a stop condition, checked before each model call (truthy: stop)."""
    return _decorate(fn, HookKind.STOP, 0.0, priority, ())


@overload
def group_reward(fn: F, /) -> F: ...
@overload
def group_reward(
    *, weight: float = 1.0, priority: int = 0, keys: Sequence[str] = ()
) -> Callable[[F], F]: ...
def group_reward(
    fn: Any = None, /, *, weight: float = 1.0, priority: int = 0, keys: Sequence[str] = ()
) -> Any:
    """Mark a Task method that gets all n ``traces`` of one task and returns one value per trace."""
    return _decorate(fn, HookKind.GROUP_REWARD, weight, priority, keys)
