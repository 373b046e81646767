"""The ``null`` harness: the chat loop with no tools, for single-turn tasks and user simulators."""

from __future__ import annotations

from vfray.harnesses.chat import ChatLoopHarness


class NullHarness(ChatLoopHarness):
    """Sends the prompt, relays the model's answer, runs no code."""

    id = "null"
    TOOLS = ()
    SUPPORTS_MCP = False  # the tool-less harness: a task with tools needs 'bash' or an agent
    EXECUTES_CODE = False
