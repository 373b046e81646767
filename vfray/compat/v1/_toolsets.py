"""verifiers' own ``Toolset`` objects (the real ``verifiers.v1.Toolset``, an MCP server each) served
as vfray toolsets: each ``@vf.tool`` method of the genuine instance becomes a vfray tool of the
same signature and docstring, advertised under v1's name (``<server_name>_<tool>``, bare when
``TOOL_PREFIX = None``), and called on the genuine instance. vfray serves it on the host, per
rollout, as it serves its own toolsets; v1's per-call state channel (``self.state``) is its
inert default, and a toolset that overrides ``setup_task`` is refused (it needs v1's task
channel)."""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable
from typing import Any, ClassVar

from vfray.errors import ConfigError
from vfray.tools.toolset import TOOL_ATTR, Placement, Scope
from vfray.tools.toolset import Toolset as VfrayToolset


class GenuineToolset(VfrayToolset):
    """One genuine v1 toolset instance under vfray (subclassed per v1 class by :func:`serve`)."""

    v1_class: ClassVar[type[Any]]

    def __init__(self, config: Any) -> None:
        self.v1_config = config
        self._v1: Any = None
        self._ready: asyncio.Lock | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt from its v1 class (importable by reference) and config where it is served:
        # the genuine instance holds an exit stack and HTTP clients that do not pickle.
        return (_rebuild, (self.v1_class, self.v1_config, self.scope == Scope.SHARED))

    async def v1_instance(self) -> Any:
        if self._ready is None:
            self._ready = asyncio.Lock()
        async with self._ready:
            if self._v1 is None:
                made = self.v1_class(self.v1_config)
                await made.setup()  # v1 runs it once per server, before its first call
                self._v1 = made
        return self._v1


def _rebuild(cls: type[Any], config: Any, shared: bool) -> GenuineToolset:
    return _class_for(cls, shared)(config)


_CLASSES: dict[tuple[type, bool], type[GenuineToolset]] = {}


def _class_for(cls: type[Any], shared: bool = False) -> type[GenuineToolset]:
    found = _CLASSES.get((cls, shared))
    if found is not None:
        return found
    base = next(k for k in cls.__mro__ if k.__name__ == "ServerBase")
    if cls.setup_task is not base.setup_task:  # type: ignore[attr-defined]
        raise ConfigError(
            f"v1 toolset {cls.__qualname__}: setup_task is not supported by vfray yet "
            "(it reads the rollout's task through v1's state channel)"
        )
    probe: Any = object.__new__(cls)
    prefix = probe.server_name if isinstance(probe.server_name, str) else ""
    body: dict[str, Any] = {
        "v1_class": cls,
        "name": prefix or cls.__name__,
        "__module__": __name__,
        "__qualname__": f"GenuineToolset[{cls.__qualname__}]{'[shared]' if shared else ''}",
        "scope": Scope.SHARED if shared else Scope.ROLLOUT,
    }
    names = {
        name
        for klass in cls.__mro__
        for name, fn in vars(klass).items()
        if callable(fn) and getattr(fn, "tool", False) is True
    }
    for attr in sorted(names):
        fn = getattr(cls, attr)
        if not getattr(fn, "tool", False):  # an undecorated override drops it, as in v1
            continue
        tool = getattr(fn, "tool_name", None) or attr
        body[attr] = _delegate(fn, attr, f"{prefix}_{tool}" if prefix else tool)
    made = type(f"V1{cls.__name__}", (GenuineToolset,), body)
    _CLASSES[(cls, shared)] = made
    return made


def _delegate(fn: Callable[..., Any], attr: str, name: str) -> Callable[..., Any]:
    @functools.wraps(fn)  # the signature, hints and docstring vfray describes the tool by
    async def call(self: GenuineToolset, **kwargs: Any) -> Any:
        method = getattr(await self.v1_instance(), attr)
        value = method(**kwargs)
        return await value if inspect.isawaitable(value) else value

    setattr(call, TOOL_ATTR, name)
    return call


def is_genuine_toolset(obj: object) -> bool:
    """Whether ``obj`` is an instance of verifiers' own ``Toolset`` (an MCP ``ServerBase``)."""
    return any(
        k.__name__ == "ServerBase" and k.__module__.startswith("verifiers.")
        for k in type(obj).__mro__
    )


def serve(toolset: Any) -> GenuineToolset:
    """The vfray toolset serving the genuine v1 ``toolset``."""
    return _class_for(type(toolset))(toolset.config)


def shared_toolset(toolset: Any) -> VfrayToolset:
    """A taskset's toolset (v1's ``Taskset.toolsets``: one server for the whole run) as a vfray
    shared toolset: one instance per run (per node on Ray), each rollout its own binding and
    ``self.state``."""
    url = getattr(getattr(toolset, "config", None), "url", None)
    if url:
        raise ConfigError(
            f"v1 taskset toolset {type(toolset).__qualname__}: url={url!r} is not supported "
            "(vfray serves a taskset's toolsets itself, on the host)"
        )
    if is_genuine_toolset(toolset):
        return _class_for(type(toolset), shared=True)(toolset.config)
    if not isinstance(toolset, VfrayToolset) or toolset.placement != Placement.HOST:
        raise ConfigError(
            f"v1 taskset toolset {type(toolset).__qualname__}: vfray shares a verifiers.v1 "
            "Toolset served on the host"
        )
    made: VfrayToolset = object.__new__(_shared_class(type(toolset)))
    made.__dict__.update(toolset.__dict__)
    return made


_SHARED: dict[type, type[VfrayToolset]] = {}


def _shared_class(cls: type[VfrayToolset]) -> type[VfrayToolset]:
    found = _SHARED.get(cls)
    if found is None:
        body = {
            "scope": Scope.SHARED,
            "__module__": __name__,
            "__qualname__": f"Shared[{cls.__qualname__}]",
            "__reduce__": _reduce_shared,
        }
        found = _SHARED[cls] = type(cls.__name__, (cls,), body)  # same name: same tool names
    return found


def _reduce_shared(self: VfrayToolset) -> tuple[Any, ...]:
    # Pickled as the plain toolset, made shared again where it lands (the class is made here).
    plain: VfrayToolset = object.__new__(type(self).__mro__[1])
    plain.__dict__.update(self.__dict__)
    return (shared_toolset, (plain,))
