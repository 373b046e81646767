"""One rollout's agent program across its segments: the launch, then one resume per user message.

:class:`AgentSession` is what the rollout drives. The default one relaunches the program for each
later segment on the conversation so far (the program's transcript in the box, else the trace as
the interception recorded it); a live-session harness (ACP) returns its own, which keeps one
process and sends each user message into the same session.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from vfray.harness import LaunchContext, with_conversation
from vfray.runtimes.base import ProgramResult, Runtime
from vfray.trace import Message

if TYPE_CHECKING:
    from vfray.harness import Harness


class AgentSession:
    """The default session: each segment is one run of the program to its exit."""

    def __init__(
        self, harness: Harness, runtime: Runtime, history: Callable[[], Sequence[Message]]
    ) -> None:
        self.harness = harness
        self.runtime = runtime
        self.history = history
        """The conversation as the interception recorded it (used when the box has none)."""
        self.segments = 0

    async def segment(self, ctx: LaunchContext, message: str | None) -> ProgramResult:
        """Run the next segment and wait for it to end. The first is the launch on the task's
        prompt (with ``message`` appended when the user speaks first); each later one resumes
        the conversation with ``message`` as the new user turn."""
        self.segments += 1
        new = [] if message is None else [Message(role="user", content=message)]
        if self.segments == 1:
            if new:
                prompt = [Message.model_validate(m) for m in self.harness.resolve_prompt(ctx.data)]
                ctx = with_conversation(ctx, [*prompt, *new])
            return await self.harness.launch(ctx, self.runtime)
        transcript = await self.harness.read_transcript(self.runtime)
        history = transcript if transcript is not None else list(self.history())
        return await self.harness.resume(ctx, self.runtime, [*history, *new])

    async def close(self) -> None:
        """End whatever the session still runs (always called, also after a failure)."""
