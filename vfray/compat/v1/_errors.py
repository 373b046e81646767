"""v1's rollout errors (``verifiers.v1.errors``) as vfray's own, so a v1 hook's raise is typed on
the trace as vfray would type it: the ones vfray has are served as they are (``ToolsetError`` is
vfray's ``ToolError``); v1's ``EnvError`` and ``TunnelError`` are subclasses of vfray's."""

from __future__ import annotations

from vfray.errors import (
    HarnessError,
    InterceptionError,
    ProviderError,
    RolloutError,
    SandboxError,
    TaskError,
    ToolError,
)

ToolsetError = ToolError
"""A task's toolset could not be built or served (vfray's ``ToolError``)."""


class EnvError(RolloutError):
    """The env's own hooks failed (its ``run`` or ``finalize`` raised)."""


class TunnelError(InterceptionError):
    """The tunnel to the interception endpoint failed."""


__all__ = [
    "EnvError",
    "HarnessError",
    "InterceptionError",
    "ProviderError",
    "RolloutError",
    "SandboxError",
    "TaskError",
    "ToolsetError",
    "TunnelError",
]
