"""The ``compact`` harness: the ``bash`` chat loop that compacts its context. Once the context
passes ``compact_at`` tokens (the last reply's ``usage.total_tokens``), the program asks the
model for a summary and goes on from the system prompt, the task and that summary alone.

The new context is no extension of the old one, so the interception's prefix rule
(:meth:`vfray.trace.Trace.record_call`) opens a new :class:`vfray.trace.Branch` for it, and
each branch is its own training sample (:func:`vfray.traces.samples.to_samples`), credited with
the rollout's reward. The summary request itself ends the branch it summarises.
"""

from __future__ import annotations

from pydantic import Field

from vfray.harnesses.bash import BashHarness
from vfray.harnesses.chat import ChatLoopConfig


class CompactConfig(ChatLoopConfig):
    """Options of the compacting chat loop."""

    compact_at: int = Field(100_000, gt=0)
    """Context tokens (prompt and completion of the last call) past which the program compacts
    before its next call."""


class CompactHarness(BashHarness):
    """The ``bash`` harness (``bash`` and ``edit`` tools) with context compaction."""

    id = "compact"
    config_type = CompactConfig
    config: CompactConfig

    def program_flags(self) -> list[str]:
        return ["--compact-at", str(self.config.compact_at)]
