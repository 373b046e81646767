"""A reply an agent sends back with its tool-call arguments re-serialized (goose writes
``{"command":"ls"}`` for the model's ``{"command": "ls"}``) is the reply: the call extends its
branch. Any other change still starts a new branch."""

from __future__ import annotations

from typing import Any

from vfray.interception.resent import as_replied
from vfray.trace import Message, TaskRecord, Trace

SYSTEM = Message(role="system", content="s")
USER = Message(role="user", content="u")


def _assistant(arguments: str, call_id: str = "c1", content: Any = None) -> Message:
    function = {"name": "shell", "arguments": arguments}
    call = {"id": call_id, "type": "function", "function": function}
    return Message(role="assistant", content=content, tool_calls=[call])


def _branches(resent: Message) -> list[list[int]]:
    trace = Trace(task=TaskRecord(key="k", hash="h", data={}))
    trace.record_call([SYSTEM, USER], _assistant('{"command": "ls", "n": 1}'))
    tool = Message(role="tool", content="out", tool_call_id="c1")
    request = as_replied(trace, [SYSTEM, USER, resent, tool])
    trace.record_call(request, Message(role="assistant", content="done"))
    return [b.call_indices for b in trace.branch_list]


def test_a_reply_sent_back_respelled_extends_its_branch() -> None:
    assert _branches(_assistant('{"n":1,"command":"ls"}')) == [[0, 1]]
    assert _branches(_assistant('{"command": "ls", "n": 1}')) == [[0, 1]]  # as it was sent


def test_a_changed_reply_starts_a_new_branch() -> None:
    assert _branches(_assistant('{"command":"pwd","n":1}')) == [[0], [1]]
    assert _branches(_assistant('{"command":"ls","n":1}', call_id="c2")) == [[0], [1]]
    assert _branches(_assistant('{"command":"ls","n":1}', content="hm")) == [[0], [1]]
    assert _branches(_assistant("not json")) == [[0], [1]]
