"""The scripted model's three wire dialects: parse OpenAI chat, OpenAI Responses and Anthropic
Messages requests into a :class:`Conversation`, and render a :class:`Reply` as each API's
non-streaming body or exact SSE event sequence.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from vfray.testing.policies import Conversation, Reply

Json = dict[str, Any]


class BadRequest(Exception):
    """Client input the scripted model refuses with HTTP 400."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


@dataclass(frozen=True)
class Request:
    conv: Conversation
    model: str | None
    stream: bool
    include_usage: bool


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"


def _typed(body: Json, key: str, kind: type | tuple[type, ...], what: str) -> Any:
    value = body.get(key)
    # bool is an int subclass; a JSON true is never a valid count or seed.
    if value is not None and (
        not isinstance(value, kind) or (isinstance(value, bool) and kind is int)
    ):
        raise BadRequest(f"'{key}' must be {what}", key)
    return value


def _max_tokens(body: Json, *keys: str) -> int | None:
    for key in keys:
        value = _typed(body, key, int, "a positive integer")
        if value is not None:
            if value < 1:
                raise BadRequest(f"'{key}' must be a positive integer", key)
            return int(value)
    return None


def _text(content: Any, where: str) -> str:
    """The text of a message content: a string, or a list of parts whose text parts are joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest(f"{where} must be a string or a list of content parts", where)
    texts: list[str] = []
    for part in content:
        if not isinstance(part, dict):
            raise BadRequest(f"{where} parts must be objects", where)
        if part.get("type") == "tool_result":
            texts.append(_text(part.get("content"), f"{where}.content"))
        elif isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif part.get("type") == "tool_use":
            texts.append(json.dumps(part.get("input", {})))
    return "\n".join(texts)


def _objects(body: Json, key: str, *, required: bool) -> list[Json]:
    value = body.get(key)
    if value is None and not required:
        return []
    if not isinstance(value, list) or (required and not value):
        raise BadRequest(
            f"'{key}' must be a non-empty list" if required else f"'{key}' must be a list", key
        )
    if not all(isinstance(item, dict) for item in value):
        raise BadRequest(f"every item of '{key}' must be an object", key)
    return value


def _tool_names(body: Json) -> frozenset[str]:
    names: set[str] = set()
    for tool in _objects(body, "tools", required=False):
        function = tool.get("function")
        name = function.get("name") if isinstance(function, dict) else tool.get("name")
        if isinstance(name, str):
            names.add(name)
    return frozenset(names)


def _common(
    body: Json, texts: list[str], last_user: str, tool_output: str | None, max_tokens: int | None
) -> Request:
    stream = _typed(body, "stream", bool, "a boolean") or False
    model = _typed(body, "model", str, "a string")
    options = _typed(body, "stream_options", dict, "an object") or {}
    conv = Conversation(
        texts=tuple(texts),
        last_user=last_user,
        tool_names=_tool_names(body),
        tool_output=tool_output,
        max_tokens=max_tokens,
        seed=_typed(body, "seed", int, "an integer"),
        want_tokens=bool(
            body.get("logprobs") or body.get("return_token_ids") or body.get("top_logprobs")
        ),
    )
    return Request(conv, model, bool(stream), bool(options.get("include_usage")))


def parse_chat(body: Json) -> Request:
    messages = _objects(body, "messages", required=True)
    n = _typed(body, "n", int, "an integer")
    if n not in (None, 1):
        raise BadRequest("the scripted model supports only n=1", "n")
    texts, last_user, tool_output = [], "", None
    for i, message in enumerate(messages):
        role = message.get("role")
        if role not in ("system", "developer", "user", "assistant", "tool", "function"):
            raise BadRequest(
                f"messages[{i}].role must be system, developer, user, assistant or tool",
                f"messages[{i}].role",
            )
        text = _text(message.get("content"), f"messages[{i}].content")
        for call in message.get("tool_calls") or []:
            if isinstance(call, dict) and isinstance(call.get("function"), dict):
                texts.append(str(call["function"].get("arguments", "")))
        texts.append(text)
        if role == "user":
            last_user = text
        tool_output = text if role in ("tool", "function") else None
    return _common(
        body,
        texts,
        last_user,
        tool_output,
        _max_tokens(body, "max_completion_tokens", "max_tokens"),
    )


def parse_responses(body: Json) -> Request:
    if body.get("previous_response_id") is not None:
        raise BadRequest(
            "the scripted model keeps no state: send the full input, not previous_response_id",
            "previous_response_id",
        )
    instructions = _typed(body, "instructions", str, "a string")
    texts = [instructions] if instructions else []
    raw = body.get("input")
    if isinstance(raw, str):
        items: list[Json] = [{"role": "user", "content": raw}]
    else:
        items = _objects(body, "input", required=True)
    last_user, tool_output = "", None
    for i, item in enumerate(items):
        kind = item.get("type", "message")
        tool_output = None
        if kind == "message":
            if item.get("role") not in ("system", "developer", "user", "assistant"):
                raise BadRequest(
                    f"input[{i}].role must be system, developer, user or assistant",
                    f"input[{i}].role",
                )
            text = _text(item.get("content"), f"input[{i}].content")
            if item["role"] == "user":
                last_user = text
        elif kind == "function_call_output":
            text = tool_output = _text(item.get("output"), f"input[{i}].output")
        elif kind == "function_call":
            text = str(item.get("arguments", ""))
        else:
            continue  # reasoning and other items carry nothing a policy reads
        texts.append(text)
    return _common(body, texts, last_user, tool_output, _max_tokens(body, "max_output_tokens"))


def parse_anthropic(body: Json) -> Request:
    messages = _objects(body, "messages", required=True)
    max_tokens = _max_tokens(body, "max_tokens")
    if max_tokens is None:
        raise BadRequest("max_tokens: Field required", "max_tokens")
    texts = [_text(body.get("system"), "system")]
    last_user, tool_output = "", None
    for i, message in enumerate(messages):
        role = message.get("role")
        if role not in ("user", "assistant"):
            raise BadRequest(
                f"messages.{i}.role must be 'user' or 'assistant'", f"messages.{i}.role"
            )
        content = message.get("content")
        text = _text(content, f"messages.{i}.content")
        texts.append(text)
        results = (
            [b for b in content if isinstance(b, dict) and b.get("type") == "tool_result"]
            if isinstance(content, list)
            else []
        )
        tool_output = (
            "\n".join(_text(b.get("content"), "tool_result") for b in results) if results else None
        )
        if role == "user" and not results:
            last_user = text
    return _common(body, texts, last_user, tool_output, max_tokens)


# -- rendering -------------------------------------------------------------------------------


def sse(data: Json | str, event: str | None = None) -> str:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return (f"event: {event}\n" if event else "") + f"data: {payload}\n\n"


def _logprob_entries(reply: Reply, start: int = 0, stop: int | None = None) -> list[Json]:
    pieces = reply.pieces[start:stop]
    return [
        {"token": p, "logprob": lp, "bytes": list(p.encode()), "top_logprobs": []}
        for p, lp in zip(pieces, reply.logprobs[start:stop], strict=True)
    ]


# OpenAI chat completions


def _chat_usage(reply: Reply) -> Json:
    n_in, n_out = reply.prompt_tokens, reply.completion_tokens
    return {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out}


def _chat_tool_calls(reply: Reply) -> list[Json]:
    call = reply.tool_call
    assert call is not None
    return [
        {
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments},
        }
    ]


def chat_body(reply: Reply, model: str) -> Json:
    message: Json = {
        "role": "assistant",
        "content": reply.text if reply.tool_call is None else None,
    }
    if reply.tool_call is not None:
        message["tool_calls"] = _chat_tool_calls(reply)
    choice: Json = {"index": 0, "message": message, "logprobs": None, "finish_reason": reply.finish}
    body: Json = {
        "id": new_id("chatcmpl-"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": _chat_usage(reply),
        "system_fingerprint": None,
    }
    if reply.with_tokens:
        body["prompt_token_ids"] = reply.prompt_token_ids
        choice["token_ids"] = reply.token_ids
        choice["logprobs"] = {"content": _logprob_entries(reply)}
    return body


def chat_events(reply: Reply, model: str, include_usage: bool) -> list[str]:
    base: Json = {
        "id": new_id("chatcmpl-"),
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": None,
    }
    if include_usage:
        base["usage"] = None

    def chunk(
        delta: Json, finish: str | None = None, index: int | None = None, top: Json | None = None
    ) -> str:
        choice: Json = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        if reply.with_tokens and index is not None:
            choice["token_ids"] = reply.token_ids[index : index + 1]
            choice["logprobs"] = {"content": _logprob_entries(reply, index, index + 1)}
        return sse({**base, **(top or {}), "choices": [choice]})

    first: Json = {"prompt_token_ids": reply.prompt_token_ids} if reply.with_tokens else {}
    events = [
        chunk({"role": "assistant", "content": "" if reply.tool_call is None else None}, top=first)
    ]
    call = reply.tool_call
    if call is not None:
        events.append(
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": call.id,
                            "type": "function",
                            "function": {"name": call.name, "arguments": ""},
                        }
                    ]
                }
            )
        )
    for i, piece in enumerate(reply.pieces):
        delta = (
            {"content": piece}
            if call is None
            else {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}
        )
        events.append(chunk(delta, index=i))
    events.append(chunk({}, reply.finish))
    if include_usage:
        events.append(sse({**base, "choices": [], "usage": _chat_usage(reply)}))
    events.append(sse("[DONE]"))
    return events


# OpenAI Responses


def _responses_usage(reply: Reply) -> Json:
    n_in, n_out = reply.prompt_tokens, reply.completion_tokens
    return {
        "input_tokens": n_in,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": n_out,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": n_in + n_out,
    }


def _responses_item(reply: Reply, item_id: str, done: bool) -> Json:
    status = "completed" if done else "in_progress"
    call = reply.tool_call
    if call is not None:
        return {
            "type": "function_call",
            "id": item_id,
            "call_id": call.id,
            "name": call.name,
            "arguments": call.arguments if done else "",
            "status": status,
        }
    content = [_responses_part(reply, reply.text)] if done else []
    return {
        "type": "message",
        "id": item_id,
        "status": status,
        "role": "assistant",
        "content": content,
    }


def _responses_part(reply: Reply, text: str) -> Json:
    return {
        "type": "output_text",
        "text": text,
        "annotations": [],
        "logprobs": _logprob_entries(reply) if text and reply.with_tokens else [],
    }


def _response(reply: Reply, model: str, resp_id: str, item_id: str, stage: str) -> Json:
    done = stage == "done"
    status = (
        "in_progress" if not done else ("incomplete" if reply.finish == "length" else "completed")
    )
    body: Json = {
        "id": resp_id,
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "model": model,
        "output": [_responses_item(reply, item_id, True)] if done else [],
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": None,
        "metadata": {},
        "parallel_tool_calls": True,
        "temperature": 1.0,
        "top_p": 1.0,
        "tool_choice": "auto",
        "tools": [],
        "text": {"format": {"type": "text"}},
        "truncation": "disabled",
        "usage": _responses_usage(reply) if done else None,
    }
    if reply.with_tokens:
        body["prompt_token_ids"] = reply.prompt_token_ids
        body["token_ids"] = reply.token_ids if done else []
    return body


def responses_body(reply: Reply, model: str) -> Json:
    return _response(
        reply, model, new_id("resp_"), new_id("fc_" if reply.tool_call else "msg_"), "done"
    )


def responses_events(reply: Reply, model: str) -> list[str]:
    resp_id, item_id = new_id("resp_"), new_id("fc_" if reply.tool_call else "msg_")
    events: list[str] = []

    def emit(kind: str, **fields: Any) -> None:
        events.append(sse({"type": kind, "sequence_number": len(events), **fields}, kind))

    where = {"item_id": item_id, "output_index": 0}
    emit("response.created", response=_response(reply, model, resp_id, item_id, "start"))
    emit("response.in_progress", response=_response(reply, model, resp_id, item_id, "start"))
    emit("response.output_item.added", output_index=0, item=_responses_item(reply, item_id, False))
    call = reply.tool_call
    if call is not None:
        for piece in reply.pieces:
            emit("response.function_call_arguments.delta", **where, delta=piece)
        emit(
            "response.function_call_arguments.done",
            **where,
            name=call.name,
            arguments=call.arguments,
        )
    else:
        emit(
            "response.content_part.added", **where, content_index=0, part=_responses_part(reply, "")
        )
        for i, piece in enumerate(reply.pieces):
            logprobs = _logprob_entries(reply, i, i + 1) if reply.with_tokens else []
            emit(
                "response.output_text.delta",
                **where,
                content_index=0,
                delta=piece,
                logprobs=logprobs,
            )
        part = _responses_part(reply, reply.text)
        emit(
            "response.output_text.done",
            **where,
            content_index=0,
            text=reply.text,
            logprobs=part["logprobs"],
        )
        emit("response.content_part.done", **where, content_index=0, part=part)
    emit("response.output_item.done", output_index=0, item=_responses_item(reply, item_id, True))
    final = _response(reply, model, resp_id, item_id, "done")
    emit(
        "response.incomplete" if final["status"] == "incomplete" else "response.completed",
        response=final,
    )
    return events


# Anthropic Messages

_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def _anthropic_usage(reply: Reply, output_tokens: int) -> Json:
    return {
        "input_tokens": reply.prompt_tokens,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


def _anthropic_block(reply: Reply, done: bool) -> Json:
    call = reply.tool_call
    if call is not None:
        return {
            "type": "tool_use",
            "id": call.id,
            "name": call.name,
            "input": json.loads(call.arguments) if done else {},
        }
    return {"type": "text", "text": reply.text if done else ""}


def _message(reply: Reply, model: str, msg_id: str, done: bool) -> Json:
    body: Json = {
        "id": msg_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [_anthropic_block(reply, True)] if done else [],
        "stop_reason": _STOP_REASONS[reply.finish] if done else None,
        "stop_sequence": None,
        "usage": _anthropic_usage(reply, reply.completion_tokens if done else 1),
    }
    if reply.with_tokens:
        body["prompt_token_ids"] = reply.prompt_token_ids
        body["token_ids"] = reply.token_ids if done else []
        body["logprobs"] = {"content": _logprob_entries(reply) if done else []}
    return body


def anthropic_body(reply: Reply, model: str) -> Json:
    return _message(reply, model, new_id("msg_"), True)


def anthropic_events(reply: Reply, model: str) -> list[str]:
    events: list[str] = []

    def emit(kind: str, **fields: Any) -> None:
        events.append(sse({"type": kind, **fields}, kind))

    emit("message_start", message=_message(reply, model, new_id("msg_"), False))
    emit("content_block_start", index=0, content_block=_anthropic_block(reply, False))
    emit("ping")
    for piece in reply.pieces:
        if reply.tool_call is not None:
            emit(
                "content_block_delta",
                index=0,
                delta={"type": "input_json_delta", "partial_json": piece},
            )
        else:
            emit("content_block_delta", index=0, delta={"type": "text_delta", "text": piece})
    emit("content_block_stop", index=0)
    extra: Json = {}
    if reply.with_tokens:
        extra = {"token_ids": reply.token_ids, "logprobs": {"content": _logprob_entries(reply)}}
    stop = {"stop_reason": _STOP_REASONS[reply.finish], "stop_sequence": None}
    emit(
        "message_delta", delta=stop, usage=_anthropic_usage(reply, reply.completion_tokens), **extra
    )
    emit("message_stop")
    return events
