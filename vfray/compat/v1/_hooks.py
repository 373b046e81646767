"""verifiers v1's hook decorators and their rules: marks on the function (the attribute names v1
uses, so functions decorated by either are read alike), discovery over the class MRO, injection by
parameter name and, for ``@stop``, by type annotation (``Request`` / ``Response`` / ``Trace``)."""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable
from typing import Any, TypeVar, get_origin, get_type_hints, overload

from vfray.errors import ConfigError

F = TypeVar("F", bound=Callable[..., Any])


def _mark(attr: str, **extra: Any) -> Callable[[F], F]:
    def decorator(f: F) -> F:
        setattr(f, attr, True)
        for key, value in extra.items():
            setattr(f, key, value)
        return f

    return decorator


@overload
def reward(func: F, weight: float = 1.0, priority: int = 0) -> F: ...
@overload
def reward(func: None = None, weight: float = 1.0, priority: int = 0) -> Callable[[F], F]: ...
def reward(func: Any = None, weight: float = 1.0, priority: int = 0) -> Any:
    """A weighted task reward (``trace.reward`` is the sum of score x weight)."""
    decorator = _mark("reward", reward_priority=priority, _vf_weight=weight)
    return decorator if func is None else decorator(func)


@overload
def metric(func: F, priority: int = 0) -> F: ...
@overload
def metric(func: None = None, priority: int = 0) -> Callable[[F], F]: ...
def metric(func: Any = None, priority: int = 0) -> Any:
    """A recorded, unweighted task metric."""
    decorator = _mark("metric", metric_priority=priority)
    return decorator if func is None else decorator(func)


@overload
def stop(func: F, priority: int = 0) -> F: ...
@overload
def stop(func: None = None, priority: int = 0) -> Callable[[F], F]: ...
def stop(func: Any = None, priority: int = 0) -> Any:
    """Stop when a predicate over a typed ``Request``, ``Response`` or ``Trace`` is true."""
    decorator = _mark("stop", stop_priority=priority)
    return decorator if func is None else decorator(func)


@overload
def intercept(func: F, priority: int = 0) -> F: ...
@overload
def intercept(func: None = None, priority: int = 0) -> Callable[[F], F]: ...
def intercept(func: Any = None, priority: int = 0) -> Any:
    """Rewrite a typed boundary (not run by vfray: a task using it is refused when adapted)."""
    decorator = _mark("intercept", intercept_priority=priority)
    return decorator if func is None else decorator(func)


@overload
def tool(func: F, name: str | None = None) -> F: ...
@overload
def tool(func: None = None, name: str | None = None) -> Callable[[F], F]: ...
def tool(func: Any = None, name: str | None = None) -> Any:
    """An MCP tool of a ``Toolset``: also marked as a ``vfray`` tool, which serves it."""
    from vfray.tools.toolset import TOOL_ATTR

    def decorator(f: F) -> F:
        _mark("tool", tool_name=name)(f)
        setattr(f, TOOL_ATTR, name or f.__name__)
        return f

    return decorator if func is None else decorator(func)


def discover(obj: object, attr: str) -> list[Callable[..., Any]]:
    """Bound methods of ``obj`` marked ``attr``, by priority (high first) then name; an
    undecorated override in a subclass drops a decorated base method, as in v1."""
    names = {
        name
        for klass in type(obj).__mro__
        for name, fn in vars(klass).items()
        if callable(fn) and hasattr(fn, attr)
    }
    methods = [m for name in names if hasattr(m := getattr(obj, name), attr)]
    methods.sort(key=lambda m: (-getattr(m, f"{attr}_priority", 0), m.__name__))
    return methods


def invoke(fn: Callable[..., Any], available: dict[Any, Any]) -> Any:
    """Call ``fn`` with what it asks for: by parameter name (str keys), then by annotation
    (type keys, matched by the class or, across frameworks, by its name)."""
    params = inspect.signature(fn).parameters
    kwargs = {name: available[name] for name in params if name in available}
    typed = {k: v for k, v in available.items() if isinstance(k, type)}
    if typed:
        for name, kind in param_annotations(fn).items():
            if name in kwargs or name not in params:
                continue
            match = typed.get(kind) if isinstance(kind, type) else None
            if match is None:
                label = type_name(kind)
                match = next((v for k, v in typed.items() if k.__name__ == label), None)
            if match is not None:
                kwargs[name] = match
    return fn(**kwargs)


def param_annotations(fn: Callable[..., Any]) -> dict[str, Any]:
    """Parameter annotations of ``fn``, resolved where they can be (else kept as strings)."""
    try:
        hints: dict[str, Any] = get_type_hints(fn)
    except Exception:  # a forward reference to a name the module never imported at runtime
        hints = dict(getattr(fn, "__annotations__", {}))
    return {k: get_origin(v) or v for k, v in hints.items() if k != "return"}


def type_name(annotation: Any) -> str:
    """A class's name, or the last part of an unresolved string annotation (``"vf.Request"``)."""
    if isinstance(annotation, str):
        return annotation.rsplit(".", 1)[-1]
    return str(getattr(annotation, "__name__", annotation))


def boundary(fn: Callable[..., Any]) -> str:
    """Which boundary a ``@stop`` watches: ``"request"``, ``"response"`` or ``"trace"`` (v1's
    rule: exactly one Request/Response parameter, else exactly one Trace)."""
    names = [type_name(a) for a in param_annotations(fn).values()]
    hits = [n for n in names if n in ("Request", "Response")]
    if len(hits) == 1 and names.count("Trace") <= 1:
        return str(hits[0]).lower()
    if not hits and names.count("Trace") == 1:
        return "trace"
    raise ConfigError(
        f"@stop {getattr(fn, '__name__', fn)} must have exactly one Request, Response, or "
        "Trace parameter (chosen by its type annotation, as in verifiers v1)"
    )


def load_function(path: str) -> Callable[..., Any]:
    """A function named ``pkg.mod.fn``, ``pkg.mod:fn`` or ``path/file.py:fn``."""
    from vfray._plugins import load_object

    if ":" not in path:
        module, _, name = path.rpartition(".")
        if not module:
            raise ConfigError(f"plugged function {path!r}: expected pkg.module.function")
        try:
            found = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"plugged function {path!r}: {exc}") from exc
    else:
        found = load_object(path)
    if not callable(found):
        raise ConfigError(f"plugged function {path!r} is not callable")
    return found  # type: ignore[no-any-return]


def plugged(
    name: str, fn_path: str | None, attr: str, decorated: Callable[..., Any] | None, **meta: Any
) -> Callable[..., Any]:
    """A config-plugged hook under ``name``, tagged like its decorator; unset metadata keeps
    the replaced function's."""
    if fn_path:
        fn = load_function(fn_path)
    elif decorated is not None:
        fn = decorated
    else:
        raise ConfigError(
            f"{attr} {name!r} plugs no fn and the task has no @{attr} method {name!r} to override"
        )

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    wrapper.__name__ = name
    setattr(wrapper, attr, True)
    priority = meta.get("priority")
    setattr(
        wrapper,
        f"{attr}_priority",
        getattr(fn, f"{attr}_priority", 0) if priority is None else priority,
    )
    if attr == "reward":
        weight = meta.get("weight")
        wrapper.__dict__["_vf_weight"] = (
            getattr(fn, "_vf_weight", 1.0) if weight is None else weight
        )
    return wrapper
