"""Example taskset with a task-scoped MCP toolset: each rollout gets its own scratchpad (notes
kept in the toolset instance, gone when the rollout ends); the reward checks the agent stored
the note and read it back, from the tool calls recorded on the trace.

Run: ``vfray eval examples/tools_scratchpad.py:ScratchpadTaskset -n 3 --harness bash
-m scripted:agent`` (add ``--runtime bwrap`` to serve the tools to a box without network).
"""

from __future__ import annotations

from collections.abc import Sequence

import vfray as vf
from vfray.tools import Placement, ToolFailed


class Scratchpad(vf.Toolset):
    """A per-rollout key-value notepad."""

    def __init__(self) -> None:
        self.notes: dict[str, str] = {}

    @vf.tool
    def write_note(self, key: str, text: str) -> str:
        """Store ``text`` under ``key`` (replacing what was there)."""
        self.notes[key] = text
        return f"stored {key}"

    @vf.tool
    def read_note(self, key: str) -> str:
        """The text stored under ``key``."""
        if key not in self.notes:
            raise ToolFailed(f"no note called {key!r}")
        return self.notes[key]


class InBoxScratchpad(Scratchpad):
    """The same notepad served inside the rollout's box (reached on its loopback)."""

    name = "scratchpad"
    placement = Placement.BOX


class NoteData(vf.TaskData):
    key: str
    text: str


class NoteTask(vf.Task[NoteData]):
    in_box = False

    def toolsets(self) -> Sequence[vf.Toolset]:
        return [InBoxScratchpad() if self.in_box else Scratchpad()]

    @vf.reward
    def remembered(self, trace: vf.Trace) -> bool:
        reads = [c for c in trace.tool_calls if c.name == "read_note" and c.error is None]
        return any(c.result == self.data.text for c in reads)


def note_prompt(key: str, text: str) -> str:
    return (
        "Use the scratchpad. Steps:\n"
        f'tool: write_note {{"key": "{key}", "text": "{text}"}}\n'
        f'tool: read_note {{"key": "{key}"}}\n'
    )


class ScratchpadTaskset(vf.Taskset[NoteTask]):
    def __init__(self, in_box: bool = False) -> None:
        self.in_box = in_box

    def load(self) -> list[NoteTask]:
        tasks = []
        for i, text in enumerate(("buy milk", "call Ada", "ship v2", "water plants")):
            task = NoteTask(NoteData(prompt=note_prompt(f"n{i}", text), key=f"n{i}", text=text))
            task.in_box = self.in_box
            tasks.append(task)
        return tasks
