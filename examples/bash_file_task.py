"""Example taskset: the agent must create a file with given content using bash; the reward reads
the file inside the box (a hook that takes ``runtime``), so it checks what the agent really did.

Run: ``vfray eval examples/bash_file_task.py:BashFileTaskset -n 3 --harness bash
--runtime bwrap -m scripted:bash``; with a real agent program, ``--harness mini-swe-agent`` (or any
agent of docs/agents) and ``-m scripted:agent``: every built-in agent scores 1.0 on it.
"""

from __future__ import annotations

from collections.abc import Iterator

import vfray as vf

FILES = (
    ("greeting.txt", "hello"),
    ("answer.txt", "42"),
    ("colour.txt", "blue"),
    ("planet.txt", "mars"),
    ("todo.txt", "write tests"),
)
"""(path relative to the box's work dir, content) of each task."""


class FileData(vf.TaskData):
    path: str
    content: str


class BashFileTask(vf.Task[FileData]):
    """Passes when the file exists in the box with exactly the content (plus a trailing newline)."""

    @vf.reward
    async def file_written(self, runtime: vf.Runtime) -> bool:
        try:
            found = await runtime.read(self.data.path)
        except vf.SandboxError:
            return False  # the agent never created it
        return found.decode(errors="replace").rstrip("\n") == self.data.content

    @vf.metric
    def tool_turns(self, trace: vf.Trace) -> int:
        return sum(1 for call in trace.calls if call.finish_reason == "tool_calls")


def make_task(path: str, content: str) -> BashFileTask:
    # One prompt for every agent: a real model reads the sentence; the scripted model's ``bash``
    # policy (the chat loops) and its ``agent`` policy (the real agent programs, Aider's edit
    # blocks included) all act on ``write "TEXT" to PATH``.
    prompt = f'Write "{content}" to {path}.'
    return BashFileTask(FileData(prompt=prompt, path=path, content=content), key=path)


class BashFileTaskset(vf.Taskset[BashFileTask]):
    """The tasks of :data:`FILES`, in order."""

    name = "bash_file"

    def load(self) -> Iterator[BashFileTask]:
        for path, content in FILES:
            yield make_task(path, content)
