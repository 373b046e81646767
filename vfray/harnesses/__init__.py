"""Built-in harnesses (``null``, ``bash``), the harness registry and the segment model.

Internal: importable, but not the public API (:mod:`vfray`, :mod:`vfray.testing`,
:mod:`vfray.train`, :mod:`vfray.compat.v1`); names here may move."""

from vfray.harnesses.base import AgentSession
from vfray.harnesses.bash import BashHarness
from vfray.harnesses.chat import ChatLoopConfig, ChatLoopHarness
from vfray.harnesses.null import NullHarness
from vfray.harnesses.registry import (
    available_harnesses,
    harness_class,
    make_harness,
    register_harness,
)

__all__ = [
    "AgentSession",
    "BashHarness",
    "ChatLoopConfig",
    "ChatLoopHarness",
    "NullHarness",
    "available_harnesses",
    "harness_class",
    "make_harness",
    "register_harness",
]
