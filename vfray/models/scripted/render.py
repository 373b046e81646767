"""The scripted model's three wire dialects, writing side: render a :class:`Reply` as each
API's non-streaming body or its exact SSE event sequence (parsing is in ``wire.py``)."""

from __future__ import annotations

import json
import time
from typing import Any

from vfray.models.scripted.conversation import Reply
from vfray.models.scripted.wire import Json, new_id


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
    if reply.reasoning:
        message["reasoning_content"] = reply.reasoning
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
    if reply.reasoning:
        events.append(chunk({"reasoning_content": reply.reasoning}))
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
            **({"namespace": call.namespace} if call.namespace else {}),
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
