"""Token-in for the Anthropic Messages and OpenAI Responses dialects: their calls go to the
endpoint as chat, and the chat reply is answered in the client's dialect.

vLLM's route that takes the prompt as token ids serves chat requests only, and its own
``/v1/messages`` and ``/v1/responses`` translate to chat internally. So with
``interception.token_in``, a call of these dialects is sent as the chat request the trace
already records (its normalized messages, its function tools as chat tools, its sampling under
chat names): the call that opens a branch to ``/chat/completions`` (so its token ids come back
as chat's), a later one to ``/chat/completions/tokens`` with the branch's exact ids plus the
bridge, as the chat dialect's calls go (:mod:`vfray.interception.token_in`). The chat reply is
answered as an Anthropic message or a Responses response, JSON or a stream (the stream is
collected and its events sent once the reply is whole), and recorded as the client will send
it back, so the next call finds its branch.

Fields that chat has no name for and that change neither the prompt nor the sampling (metadata,
``store``, ``include``, ``service_tier``) are not sent; nor is Anthropic's ``thinking`` budget
(the template's generation prompt decides whether the model thinks, as it does for the bridge).
A request that has no chat form (a tool that is not a function, such as a Responses built-in
or an Anthropic server tool; ``previous_response_id``; ``mcp_servers``) goes as it came, and
the trace says so in a ``token-in:`` note: never a silent repair. Its branch may then break like
any re-rendered one (``env.on_prefix_break = "per_turn"`` keeps its turns).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import TYPE_CHECKING, Any

from vfray.interception.dialects import Dialect, ParsedRequest, ParsedResponse
from vfray.interception.dialects.base import (
    JSON,
    Action,
    SSEEvent,
    StreamAccumulator,
    upstream_error_message,
)
from vfray.interception.dialects.chat import ChatDialect
from vfray.interception.token_in import note
from vfray.trace import Message, Trace

if TYPE_CHECKING:
    from vfray.interception.turns import Turn

DIALECTS = frozenset({"anthropic", "responses"})
"""Dialects whose calls token-in sends as chat."""

_ANTHROPIC_SAMPLING = {
    "max_tokens": "max_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "stop_sequences": "stop",
}
_RESPONSES_SAMPLING = {
    "max_output_tokens": "max_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "seed": "seed",
    "top_logprobs": "top_logprobs",
}
_CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


class NoChatForm(Exception):
    """The request cannot be sent as chat; the message says why (noted on the trace)."""


def as_chat(turn: Turn, trace: Trace) -> JSON | None:
    """Make ``turn`` (an Anthropic or Responses call) the chat call token-in sends, and return
    its body; None, noted on the trace, where the request has no chat form."""
    try:
        chat = chat_request(turn.dialect.name, turn.upstream_body, turn.request)
    except NoChatForm as exc:
        note(trace, f"call {len(trace.calls)} ({turn.dialect.name}) sent as it came: {exc}")
        return None
    turn.dialect = AsChat(turn.dialect)
    turn.upstream_body = chat
    return chat


def chat_request(dialect: str, body: JSON, request: ParsedRequest) -> JSON:
    """The chat request for a call of ``dialect`` (``body`` as imposed for its own route)."""
    renames = _ANTHROPIC_SAMPLING if dialect == "anthropic" else _RESPONSES_SAMPLING
    if dialect == "responses" and body.get("previous_response_id"):
        raise NoChatForm("previous_response_id: the conversation is held by the endpoint")
    if dialect == "anthropic" and body.get("mcp_servers"):
        raise NoChatForm("mcp_servers: the endpoint would call those tools itself")
    messages = [m.model_dump(exclude_none=True) for m in request.messages]
    for m in messages:
        if m["role"] not in _CHAT_ROLES:  # a Responses item kept whole (web_search_call, ...)
            raise NoChatForm(f"a {m['role']!r} item has no chat form")
        if any(c.get("type", "function") != "function" for c in m.get("tool_calls") or []):
            raise NoChatForm("a custom tool's call (free-text input) has no chat-template form")
    chat: JSON = {
        "model": body.get("model"),
        "messages": messages,
        "logprobs": True,
        "return_token_ids": True,
    }
    for key, name in renames.items():
        if body.get(key) is not None:
            chat[name] = body[key]
    effort = body.get("reasoning")
    if dialect == "responses" and isinstance(effort, dict) and effort.get("effort"):
        chat["reasoning_effort"] = effort["effort"]
    if dialect == "responses":
        _responses_format(body.get("text"), chat)
        if isinstance(body.get("parallel_tool_calls"), bool):
            chat["parallel_tool_calls"] = body["parallel_tool_calls"]
    tools = _chat_tools(dialect, request.tools)
    if tools:
        chat["tools"] = tools
        choice = _tool_choice(dialect, body.get("tool_choice"))
        if choice is not None:
            chat["tool_choice"] = choice
    if request.stream:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return chat


def _tool_choice(dialect: str, choice: Any) -> Any:
    """The chat ``tool_choice`` of an Anthropic or Responses one (None: the default)."""
    if choice is None:
        return None
    if dialect == "anthropic" and isinstance(choice, dict):
        kind = choice.get("type")
        if kind in ("auto", "none"):
            return kind
        if kind == "any":
            return "required"
        if kind == "tool" and choice.get("name"):
            return {"type": "function", "function": {"name": choice["name"]}}
    if dialect == "responses":
        if choice in ("auto", "none", "required"):
            return choice
        if isinstance(choice, dict) and choice.get("type") == "function" and choice.get("name"):
            return {"type": "function", "function": {"name": choice["name"]}}
    raise NoChatForm(f"the tool_choice {json.dumps(choice)[:200]} has no chat form")


def _responses_format(text: Any, chat: JSON) -> None:
    """A Responses ``text.format`` as chat's ``response_format``."""
    form = text.get("format") if isinstance(text, dict) else None
    if not isinstance(form, dict) or form.get("type") in (None, "text"):
        return
    if form.get("type") == "json_object":
        chat["response_format"] = {"type": "json_object"}
    elif form.get("type") == "json_schema":
        schema = {k: form[k] for k in ("name", "schema", "strict", "description") if k in form}
        chat["response_format"] = {"type": "json_schema", "json_schema": schema}
    else:
        raise NoChatForm(f"the text format {form.get('type')!r} has no chat form")


def _chat_tools(dialect: str, tools: list[JSON] | None) -> list[JSON] | None:
    if not tools:
        return None
    out = []
    for tool in tools:
        if dialect == "anthropic":
            kind = tool.get("type")
            if kind not in (None, "custom") or "input_schema" not in tool:
                raise NoChatForm(f"the tool {tool.get('name')!r} ({kind}) is not a function")
            schema = tool["input_schema"]
        else:
            if tool.get("type") != "function":
                raise NoChatForm(f"the tool of type {tool.get('type')!r} is not a function")
            schema = tool.get("parameters") or {"type": "object", "properties": {}}
        function: JSON = {"name": tool.get("name"), "parameters": schema}
        if tool.get("description"):
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out


def _arguments(raw: str) -> Any:
    try:
        return json.loads(raw) if raw else {}
    except ValueError:
        return {"_raw": raw}  # the model wrote arguments that are not JSON: kept, not dropped


def anthropic_message(reply: ParsedResponse, model: str) -> JSON:
    """An Anthropic Messages response for a chat reply."""
    message = reply.message or Message(role="assistant")
    content: list[JSON] = []
    if message.reasoning_content:
        content.append({"type": "thinking", "thinking": message.reasoning_content, "signature": ""})
    if message.text:
        content.append({"type": "text", "text": message.text})
    for i, call in enumerate(message.tool_calls or []):
        function = call.get("function") or {}
        content.append(
            {
                "type": "tool_use",
                "id": call.get("id") or f"toolu_{i}",  # the same in the answer and the record
                "name": function.get("name", ""),
                "input": _arguments(str(function.get("arguments") or "")),
            }
        )
    finish = "tool_calls" if message.tool_calls else reply.finish_reason
    return {
        "id": f"msg_{uuid.uuid4().hex[:24]}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": _STOP_REASONS.get(finish or "stop", "end_turn"),
        "stop_sequence": None,
        "usage": {
            "input_tokens": reply.usage.input_tokens,
            "output_tokens": reply.usage.output_tokens,
        },
    }


def responses_response(reply: ParsedResponse, model: str) -> JSON:
    """An OpenAI Responses response for a chat reply."""
    message = reply.message or Message(role="assistant")
    output: list[JSON] = []
    if message.reasoning_content:
        summary = [{"type": "summary_text", "text": message.reasoning_content}]
        output.append({"type": "reasoning", "id": f"rs_{uuid.uuid4().hex}", "summary": summary})
    if message.text:
        part = {"type": "output_text", "text": message.text, "annotations": []}
        output.append(
            {
                "type": "message",
                "id": f"msg_{uuid.uuid4().hex}",
                "role": "assistant",
                "status": "completed",
                "content": [part],
            }
        )
    for i, call in enumerate(message.tool_calls or []):
        function = call.get("function") or {}
        output.append(
            {
                "type": "function_call",
                "id": f"fc_{uuid.uuid4().hex}",
                "call_id": call.get("id") or f"call_{i}",
                "name": function.get("name", ""),
                "arguments": str(function.get("arguments") or ""),
                "status": "completed",
            }
        )
    cut = reply.finish_reason == "length"
    usage = reply.usage
    return {
        "id": f"resp_{uuid.uuid4().hex}",
        "object": "response",
        "created_at": int(time.time()),
        "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "error": None,
        "model": model,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": usage.input_tokens,
            "output_tokens": usage.output_tokens,
            "total_tokens": usage.input_tokens + usage.output_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
    }


def _event(name: str, data: JSON) -> bytes:
    return f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n".encode()


def anthropic_events(body: JSON) -> bytes:
    """The Anthropic stream of a whole message (``message_start`` to ``message_stop``)."""
    start = {**body, "content": [], "stop_reason": None}
    start["usage"] = {**body["usage"], "output_tokens": 0}
    events = [_event("message_start", {"message": start})]
    for i, block in enumerate(body["content"]):
        kind = block["type"]
        empty: JSON
        delta: JSON
        if kind == "text":
            empty = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": block["text"]}
        elif kind == "thinking":
            empty = {"type": "thinking", "thinking": "", "signature": ""}
            delta = {"type": "thinking_delta", "thinking": block["thinking"]}
        else:
            empty = {**block, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        events.append(_event("content_block_start", {"index": i, "content_block": empty}))
        events.append(_event("content_block_delta", {"index": i, "delta": delta}))
        events.append(_event("content_block_stop", {"index": i}))
    delta = {"stop_reason": body["stop_reason"], "stop_sequence": None}
    usage = {"output_tokens": body["usage"]["output_tokens"]}
    events.append(_event("message_delta", {"delta": delta, "usage": usage}))
    events.append(_event("message_stop", {}))
    return b"".join(events)


def responses_events(body: JSON) -> bytes:
    """The Responses stream of a whole response (``response.created`` to its final event)."""
    events: list[bytes] = []

    def emit(name: str, data: JSON) -> None:
        events.append(_event(name, {"sequence_number": len(events), **data}))

    emit("response.created", {"response": {**body, "status": "in_progress", "output": []}})
    for i, item in enumerate(body["output"]):
        added = {**item, "content": []} if item["type"] == "message" else item
        emit("response.output_item.added", {"output_index": i, "item": added})
        if item["type"] == "message":
            text = item["content"][0]["text"]
            part = {"item_id": item["id"], "output_index": i, "content_index": 0}
            emit("response.output_text.delta", {**part, "delta": text})
            emit("response.output_text.done", {**part, "text": text})
        emit("response.output_item.done", {"output_index": i, "item": item})
    final = "response.incomplete" if body["status"] == "incomplete" else "response.completed"
    emit(final, {"response": body})
    return b"".join(events)


class AsChat(ChatDialect):
    """A call of ``dialect`` sent as chat: the chat reply parsed, answered and recorded in the
    client's dialect (errors too); recorded under the client's dialect name."""

    def __init__(self, dialect: Dialect) -> None:
        self.client = dialect
        self.name = dialect.name
        self.final_status = dialect.final_status

    def parse_response(self, body: JSON) -> ParsedResponse:
        return self._as_sent_back(super().parse_response(body))

    def _as_sent_back(self, reply: ParsedResponse) -> ParsedResponse:
        """``reply`` with its message as the client sends it back (its tool-call arguments
        re-serialized, its parts folded), so the next call continues this one's branch."""
        back = self.client.parse_response(self.answer(reply, ""))
        reply.message = back.message if reply.message is not None else None
        return reply

    def answer(self, reply: ParsedResponse, model: str) -> JSON:
        if self.client.name == "anthropic":
            return anthropic_message(reply, model)
        return responses_response(reply, model)

    def client_reply(self, data: bytes, reply: ParsedResponse, model: str) -> bytes:
        return json.dumps(self.answer(reply, model)).encode()

    def client_error(self, status: int, data: bytes) -> bytes:
        message = upstream_error_message(data)
        text = str(message or data.decode("utf-8", "replace"))[:2000]
        return json.dumps(self.client.error_body(status, text)).encode()

    def error_body(self, status: int, message: str) -> JSON:
        return self.client.error_body(status, message)

    def accumulator(self, client_wants_usage: bool) -> StreamAccumulator:
        return _Collected(self, super().accumulator(True))


class _Collected(StreamAccumulator):
    """A chat stream collected whole; the client's dialect's events are sent at its end."""

    def __init__(self, dialect: AsChat, chat: StreamAccumulator) -> None:
        self.dialect = dialect
        self.chat = chat
        self.sent = False
        self.model = ""

    def feed(self, event: SSEEvent) -> Action:
        action = self.chat.feed(event)
        if action is Action.HOLD:  # [DONE]: the reply is whole
            return Action.HOLD
        if not self.model:
            chunk = event.json()
            if chunk is not None and isinstance(chunk.get("model"), str):
                self.model = chunk["model"]
        return Action.DROP

    def rewrite(self, block: bytes) -> bytes:
        # Called for the held [DONE] (or, if the stream ended without one, for its rest):
        # the whole reply, as the client's dialect streams it.
        if self.sent:
            return b""
        self.sent = True
        body = self.dialect.answer(self.chat.result(), self.model)
        if self.dialect.client.name == "anthropic":
            return anthropic_events(body)
        return responses_events(body)

    def result(self) -> ParsedResponse:
        return self.dialect._as_sent_back(self.chat.result())
