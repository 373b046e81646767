"""Replies an agent sends back re-serialized, mapped back to the reply the model gave.

Some agents parse a reply's tool-call arguments and send the history back with them written
again: goose (serde) sends ``{"command":"ls"}`` for the model's ``{"command": "ls"}``. The
resent assistant message then hashes to another message, the request extends no branch, and every
call of the rollout became a branch of its own. A resent assistant message that is not in the
trace, whose tool calls carry the ids of a reply this rollout recorded and which equals that
reply once each call's arguments are read as JSON, is taken as that reply: the branch extends
with the model's own text. Only the spelling of JSON arguments is forgiven; any other change
(content, a name, a value) still starts a new branch.
"""

from __future__ import annotations

import json
from typing import Any

from vfray.trace import Message, Trace


def as_replied(trace: Trace, messages: list[Message]) -> list[Message]:
    """``messages`` with each re-serialized copy of a recorded reply replaced by that reply."""
    resent = [
        i
        for i, m in enumerate(messages)
        if m.role == "assistant" and m.tool_calls and m.id not in trace.graph
    ]
    if not resent:  # the usual request: every resent reply is byte-for-byte the model's
        return messages
    replies: dict[Any, Message] = {}
    for call in trace.calls:
        if call.response_id is not None:
            recorded = trace.graph[call.response_id]
            for tool_call in recorded.tool_calls or []:
                replies[tool_call.get("id")] = recorded
    out = list(messages)
    for i in resent:
        first = (messages[i].tool_calls or [{}])[0].get("id")
        reply = replies.get(first)
        if reply is None:
            continue
        meaning = _meaning(messages[i])
        if meaning is not None and meaning == _meaning(reply):
            out[i] = reply
    return out


def _meaning(message: Message) -> dict[str, Any] | None:
    """The message with its tool calls' arguments decoded (None: one is not JSON)."""
    fields = message.model_dump(exclude_none=True)
    calls = []
    for call in fields.pop("tool_calls", []):
        if not isinstance(call.get("function"), dict):
            calls.append(call)  # a call of another kind: compared whole
            continue
        function = dict(call["function"])
        try:
            function["arguments"] = json.loads(function.get("arguments") or "{}")
        except ValueError:
            return None
        calls.append({**call, "function": function})
    fields["tool_calls"] = calls
    return fields
