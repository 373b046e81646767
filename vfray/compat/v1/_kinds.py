"""Which v1 classes a run's taskset is made of: verifiers' own when the real ``verifiers`` is
installed (vfray then runs its genuine objects and serves nothing under that name), else this
package's layer. The loader and the adapter ask here, never compare with the layer's classes
directly, so the same adapter runs either kind.

Internal: importable, but not the public API."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Kinds:
    """The v1 base classes and helpers of one implementation."""

    genuine: bool
    Taskset: type[Any]
    Env: type[Any]
    EnvConfig: type[Any]
    SingleAgentEnv: type[Any]
    BestOfNEnv: type[Any]
    Harness: type[Any]
    SelectConfig: type[Any]
    ToolsetConfig: type[Any]
    TasksetConfig: type[Any]
    AgentConfig: type[Any]


def genuine() -> bool:
    """Whether the real ``verifiers`` is importable here (then vfray does not shadow it)."""
    present = sys.modules.get("verifiers")
    if present is not None:
        from vfray.compat.v1._alias import is_ours

        return not is_ours(present)
    return importlib.util.find_spec("verifiers") is not None


@functools.cache
def _real() -> Kinds:
    vf = real_module("verifiers.v1")
    return Kinds(
        genuine=True,
        Taskset=vf.Taskset,
        Env=vf.Env,
        EnvConfig=vf.EnvConfig,
        SingleAgentEnv=vf.SingleAgentEnv,
        BestOfNEnv=real_module("verifiers.v1.envs.best_of_n").BestOfNEnv,
        Harness=vf.Harness,
        SelectConfig=vf.SelectConfig,
        ToolsetConfig=vf.ToolsetConfig,
        TasksetConfig=vf.TasksetConfig,
        AgentConfig=vf.AgentConfig,
    )


@functools.cache
def _layer() -> Kinds:
    from vfray.compat.v1._data import TasksetConfig
    from vfray.compat.v1._env import (
        AgentConfig,
        BestOfNEnv,
        Env,
        EnvConfig,
        Harness,
        SingleAgentEnv,
        ToolsetConfig,
    )
    from vfray.compat.v1._taskset import SelectConfig, Taskset

    return Kinds(
        genuine=False,
        Taskset=Taskset,
        Env=Env,
        EnvConfig=EnvConfig,
        SingleAgentEnv=SingleAgentEnv,
        BestOfNEnv=BestOfNEnv,
        Harness=Harness,
        SelectConfig=SelectConfig,
        ToolsetConfig=ToolsetConfig,
        TasksetConfig=TasksetConfig,
        AgentConfig=AgentConfig,
    )


def real_module(name: str) -> Any:
    """A module of the installed verifiers (by name: vfray neither needs nor types it)."""
    return importlib.import_module(name)


def kinds() -> Kinds:
    return _real() if genuine() else _layer()


def of(obj: Any) -> Kinds:
    """The implementation ``obj`` (a v1 object or class) belongs to."""
    cls = obj if isinstance(obj, type) else type(obj)
    if any(k.__module__.split(".", 1)[0] == "verifiers" for k in cls.__mro__) and genuine():
        return _real()
    return _layer()


def concrete_type(cls: type, base: type) -> type | None:
    """The concrete ``base`` subclass bound in ``cls``'s generic parameters, either kind."""
    if of(cls).genuine:
        found: type | None = real_module("verifiers.v1.utils.generic").concrete_type(cls, base)
        return found
    from vfray.compat.v1._task import concrete_type as ours

    return ours(cls, base)


def taskset_config_type(cls: type[Any]) -> type[Any]:
    """The config class a v1 Taskset subclass validates ``--env.taskset.*`` into."""
    k = of(cls)
    if not k.genuine:
        found: type[Any] = cls.config_type()
        return found
    generic = real_module("verifiers.v1.utils.generic")
    return generic.concrete_type(cls, k.TasksetConfig, origin=k.Taskset) or k.TasksetConfig
