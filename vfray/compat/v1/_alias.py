"""The ``verifiers.v1`` import path, served by this package, so that v1 taskset code that says
``import verifiers.v1 as vf`` runs unchanged without verifiers installed.

Installed on demand (``vfray eval`` of a v1 taskset, :func:`install`, and before a v1 task is
unpickled on a worker), never at import time. It refuses to shadow a real ``verifiers``: that one
belongs in its own virtualenv, and two implementations under one name would be a silent mix.
"""

from __future__ import annotations

import importlib.util
import sys
import types

from vfray.errors import ConfigError

_OURS = "__vfray_compat__"


def install() -> None:
    """Make ``import verifiers.v1`` (and its ``envs.best_of_n``, ``envs.user_sim``) vfray's."""
    present = sys.modules.get("verifiers")
    if present is not None:
        if getattr(present, _OURS, False):
            return
        raise ConfigError(_shadow_message())
    if importlib.util.find_spec("verifiers") is not None:
        raise ConfigError(_shadow_message())
    import vfray.compat.v1 as layer
    from vfray.compat.v1 import _env, _user_sim

    root = types.ModuleType("verifiers", "vfray's verifiers v1 compatibility layer")
    root.__path__ = []
    setattr(root, _OURS, True)
    root.v1 = layer  # type: ignore[attr-defined]
    envs = types.ModuleType("verifiers.v1.envs")
    envs.__path__ = []
    best = types.ModuleType("verifiers.v1.envs.best_of_n")
    best.BestOfNEnv = _env.BestOfNEnv  # type: ignore[attr-defined]
    best.BestOfNEnvConfig = _env.BestOfNEnvConfig  # type: ignore[attr-defined]
    envs.best_of_n = best  # type: ignore[attr-defined]
    user_sim = types.ModuleType("verifiers.v1.envs.user_sim")
    user_sim.UserSimEnv = _user_sim.UserSimEnv  # type: ignore[attr-defined]
    user_sim.UserSimEnvConfig = _user_sim.UserSimEnvConfig  # type: ignore[attr-defined]
    envs.user_sim = user_sim  # type: ignore[attr-defined]
    sys.modules.update(
        {
            "verifiers": root,
            "verifiers.v1": layer,
            "verifiers.v1.envs": envs,
            "verifiers.v1.envs.best_of_n": best,
            "verifiers.v1.envs.user_sim": user_sim,
        }
    )


def _shadow_message() -> str:
    return (
        "the real 'verifiers' package is importable here; vfray's v1 layer provides "
        "verifiers.v1 itself and will not shadow it: run v1 tasksets on vfray from an "
        "environment without verifiers (keep verifiers in its own virtualenv)"
    )
