"""The ``bash`` harness (the default): the chat loop with a ``bash`` tool run in the box and a
file ``edit`` tool; it stops when the model answers without calling a tool."""

from __future__ import annotations

from vfray.harnesses.chat import ChatLoopHarness


class BashHarness(ChatLoopHarness):
    """A minimal coding agent: shell commands and file edits in the box's work dir."""

    id = "bash"
    TOOLS = ("bash", "edit")
    EXECUTES_CODE = True
