"""The ``rlm`` harness: a recursive LM. The ``bash`` chat loop offers the model an ``ask`` tool
that poses a sub-question to a fresh copy of itself (empty context but for the system prompt,
the same tools, one level deeper, down to ``max_depth``); the sub-call's final answer is the
tool's result.

Each sub-call's context starts afresh, so the interception records it as a
:class:`vfray.trace.Branch` of its own (a training sample of its own, credited with the
rollout's reward). Every level counts against the one ``max_steps`` budget, and a refused call
in any level stops the whole program.
"""

from __future__ import annotations

from pydantic import Field

from vfray.harnesses.bash import BashHarness
from vfray.harnesses.chat import ChatLoopConfig


class RlmConfig(ChatLoopConfig):
    """Options of the recursive chat loop."""

    max_depth: int = Field(1, ge=1, le=8)
    """Levels of sub-calls: 1 lets the root ask, and its sub-calls answer without asking."""


class RlmHarness(BashHarness):
    """The ``bash`` harness plus the recursive ``ask`` tool."""

    id = "rlm"
    config_type = RlmConfig
    config: RlmConfig

    def program_flags(self) -> list[str]:
        return ["--rlm-depth", str(self.config.max_depth)]
