"""The interception layer: the recording, limiting OpenAI/Anthropic-compatible proxy.

Every model call a harness makes passes through :class:`InterceptionApp`, which forwards it to
the :class:`Upstream`, records it on the rollout's trace, and enforces the rollout's
:class:`Limits`.

Internal: importable, but not the public API (:mod:`vfray`, :mod:`vfray.testing`,
:mod:`vfray.train`, :mod:`vfray.compat.v1`); names here may move.
"""

from vfray.interception.app import Interception, InterceptionApp
from vfray.interception.limits import Limits
from vfray.interception.sessions import StopCheck
from vfray.interception.settings import InterceptionSettings
from vfray.interception.upstream import Upstream

__all__ = [
    "Interception",
    "InterceptionApp",
    "InterceptionSettings",
    "Limits",
    "StopCheck",
    "Upstream",
]
