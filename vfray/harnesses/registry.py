"""Harnesses by id: the built-ins, ones registered at run time, and ``pkg.module:Class`` paths."""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Mapping
from typing import Any

from vfray.errors import ConfigError
from vfray.harness import Harness, HarnessConfig

_BUILTIN: dict[str, str] = {
    "bash": "vfray.harnesses.bash:BashHarness",
    "null": "vfray.harnesses.null:NullHarness",
    "mini-swe-agent": "vfray.harnesses.mini_swe_agent:MiniSweAgentHarness",
    "codex": "vfray.harnesses.codex:CodexHarness",
    "claude-code": "vfray.harnesses.claude_code:ClaudeCodeHarness",
    "claude-code-acp": "vfray.harnesses.acp.claude_code:ClaudeCodeAcpHarness",
    "codex-acp": "vfray.harnesses.acp.codex:CodexAcpHarness",
}
_REGISTERED: dict[str, type[Harness]] = {}

DEFAULT_HARNESS = "bash"


def register_harness(cls: type[Harness]) -> type[Harness]:
    """Make ``cls`` available under ``cls.id`` (usable as a class decorator)."""
    if not (isinstance(cls, type) and issubclass(cls, Harness)):
        raise TypeError(f"{cls!r} is not a Harness subclass")
    _REGISTERED[cls.id] = cls
    return cls


def available_harnesses() -> list[str]:
    """Every id :func:`harness_class` accepts without an import path, sorted."""
    return sorted({*_BUILTIN, *_REGISTERED})


def _import_path(path: str) -> type[Harness]:
    module_name, _, attr = path.partition(":")
    try:
        obj = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot import harness {path!r}: {exc}") from None
    if not (isinstance(obj, type) and issubclass(obj, Harness)):
        raise ConfigError(f"{path!r} is not a Harness subclass")
    return obj


def harness_class(harness_id: str) -> type[Harness]:
    """The class for ``harness_id``: a built-in or registered id, or ``pkg.module:Class``."""
    if harness_id in _REGISTERED:
        return _REGISTERED[harness_id]
    if harness_id in _BUILTIN:
        return _import_path(_BUILTIN[harness_id])
    if ":" in harness_id:
        return _import_path(harness_id)
    known = available_harnesses()
    close = difflib.get_close_matches(harness_id, known, n=3, cutoff=0.5)
    hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
    raise ConfigError(
        f"unknown harness {harness_id!r}; {hint}known harnesses: {', '.join(known)} "
        "(or give an import path such as 'mypkg.agents:MyHarness')"
    )


def make_harness(
    harness_id: str = DEFAULT_HARNESS,
    config: HarnessConfig | Mapping[str, Any] | None = None,
) -> Harness:
    """Build the harness ``harness_id`` with ``config`` validated into its config type."""
    return harness_class(harness_id)(config)
