"""The Anthropic Messages dialect (``POST /v1/messages``): content blocks as chat messages.

``text`` blocks become content, ``image`` blocks (a ``base64`` or ``url`` source) chat
``image_url`` parts, ``tool_use`` blocks tool calls, ``thinking`` reasoning, and a user turn's
``tool_result`` blocks become ``tool`` messages, so traces of every dialect look alike. A
``system`` given as blocks is recorded as blocks; ``role: "system"`` entries in ``messages``
(Claude Code sends them) are forwarded and recorded as they are.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from vfray.interception.dialects.base import (
    JSON,
    Action,
    Dialect,
    ParsedRequest,
    ParsedResponse,
    SSEEvent,
    StreamAccumulator,
    as_int,
    chat_message,
    int_list,
    logprob_list,
    require,
    tool_call,
)
from vfray.interception.dialects.prefix import PrefixCache
from vfray.trace import Message, Usage, content_text

SAMPLING_KEYS = frozenset(
    {"temperature", "top_p", "top_k", "max_tokens", "stop_sequences", "thinking"}
)
STOP_REASONS = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length"}
STOP_REASONS["tool_use"] = "tool_calls"
# OpenAI-only sampling knobs a provider's Anthropic endpoint would reject.
_OPENAI_ONLY = frozenset(
    {"seed", "n", "logprobs", "top_logprobs", "presence_penalty", "frequency_penalty"}
)
_FORWARDED_HEADERS = ("anthropic-version", "anthropic-beta")
_ERROR_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def _blocks_to_message(role: str, content: Any, where: str) -> list[Message]:
    if not isinstance(content, list):
        return [chat_message({"role": role, "content": content}, where)]
    tools_out: list[Message] = []
    kept: list[Any] = []
    calls: list[JSON] = []
    reasoning: list[str] = []
    for i, block in enumerate(content):
        require(isinstance(block, dict), f"{where}.content[{i}] must be an object")
        kind = block.get("type")
        if kind == "tool_use":
            calls.append(tool_call(block.get("id"), block.get("name"), block.get("input")))
        elif kind == "tool_result":
            result = block.get("content")
            # A result's text blocks flatten to its text; one that shows an image keeps its
            # blocks (the image recorded as a chat image_url part, see chat_message).
            text = content_text(result) if _text_only(result) else result
            extra = {"is_error": True} if block.get("is_error") else {}
            tools_out.append(
                chat_message(
                    {
                        "role": "tool",
                        "tool_call_id": block.get("tool_use_id"),
                        "content": text,
                        **extra,
                    },
                    f"{where}.content[{i}]",
                )
            )
        elif kind == "thinking":
            reasoning.append(str(block.get("thinking") or ""))
        else:
            kept.append({k: v for k, v in block.items() if k != "cache_control"})
    messages = list(tools_out)
    if kept or calls or reasoning or not tools_out:
        raw: JSON = {"role": role, "content": kept or None}
        if calls:
            raw["tool_calls"] = calls
        if reasoning:
            raw["reasoning_content"] = "".join(reasoning)
        messages.append(chat_message(raw, where))
    return messages


def _text_only(result: Any) -> bool:
    return isinstance(result, list) and not any(
        isinstance(b, dict) and b.get("type") == "image" for b in result
    )


def _system_content(system: str | list[Any]) -> str | list[JSON]:
    """The system prompt as sent: a string, or its blocks kept as blocks (their boundaries are
    part of what the model saw), without ``cache_control`` (a cache breakpoint that moves
    between turns must not make the same prompt a different message and fork the branch)."""
    if isinstance(system, str):
        return system
    blocks: list[JSON] = []
    for i, block in enumerate(system):
        require(isinstance(block, dict), f"system[{i}] must be an object")
        blocks.append({k: v for k, v in block.items() if k != "cache_control"})
    return blocks


def _fold(items: list[Any], start: int, offset: int) -> tuple[list[Message], list[int]]:
    # Each item becomes its own messages (tool results split out): every boundary restarts.
    messages: list[Message] = []
    marks: list[int] = []
    for i in range(start, len(items)):
        raw = items[i]
        require(isinstance(raw, dict), f"messages[{i}] must be an object")
        role = raw.get("role")
        require(isinstance(role, str) and role != "", f"messages[{i}].role must be a string")
        messages.extend(_blocks_to_message(str(role), raw.get("content"), f"messages[{i}]"))
        marks.append(len(messages))
    return messages, marks


def _usage(raw: Any) -> Usage:
    if not isinstance(raw, dict):
        return Usage()
    cached = as_int(raw.get("cache_creation_input_tokens")) + as_int(
        raw.get("cache_read_input_tokens")
    )
    return Usage(
        input_tokens=as_int(raw.get("input_tokens")) + cached,
        output_tokens=as_int(raw.get("output_tokens")),
    )


def _finish(stop_reason: Any) -> str | None:
    return None if stop_reason is None else STOP_REASONS.get(str(stop_reason), str(stop_reason))


class AnthropicDialect(Dialect):
    name = "anthropic"
    # Claude Code retries 401 (and 409) with backoff for as long as it runs, and gives up at
    # once on 403.
    final_status = 403
    path = "/messages"
    sampling_keys = SAMPLING_KEYS

    def parse_request(self, body: JSON, cache: PrefixCache | None = None) -> ParsedRequest:
        raw_messages = body.get("messages")
        require(isinstance(raw_messages, list), "'messages' must be a list of messages")
        assert isinstance(raw_messages, list)
        messages: list[Message] = []
        system = body.get("system")
        require(
            system is None or isinstance(system, (str, list)),
            "'system' must be a string or a list of text blocks",
        )
        if system:
            content = _system_content(system)
            messages.append(
                Message(role="system", content=content) if cache is None else cache.system(content)
            )
        messages.extend(self.parse_items(raw_messages, _fold, cache))
        tools = body.get("tools")
        require(
            tools is None or (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)),
            "'tools' must be a list of objects",
        )
        stream = body.get("stream", False)
        require(isinstance(stream, bool), "'stream' must be a boolean")
        return ParsedRequest(messages=messages, tools=tools, stream=stream)

    def impose(self, body: JSON, model: str, sampling: Mapping[str, Any]) -> JSON:
        mapped = {
            ("stop_sequences" if k == "stop" else k): v
            for k, v in sampling.items()
            if k not in _OPENAI_ONLY
        }
        if isinstance(mapped.get("stop_sequences"), str):
            mapped["stop_sequences"] = [mapped["stop_sequences"]]
        return super().impose(body, model, mapped)

    def upstream_headers(self, api_key: str | None, client: Mapping[str, str]) -> dict[str, str]:
        headers = {"content-type": "application/json", "anthropic-version": "2023-06-01"}
        for name in _FORWARDED_HEADERS:
            if name in client:
                headers[name] = client[name]
        if api_key:
            headers["x-api-key"] = api_key
        return headers

    def parse_response(self, body: JSON) -> ParsedResponse:
        content = body.get("content")
        if not isinstance(content, list):
            raise ValueError("message without a 'content' list")
        role = body.get("role") if isinstance(body.get("role"), str) else "assistant"
        messages = _blocks_to_message(str(role), content, "content")
        return ParsedResponse(
            message=messages[-1],
            usage=_usage(body.get("usage")),
            finish_reason=_finish(body.get("stop_reason")),
            prompt_token_ids=int_list(body.get("prompt_token_ids")),
            completion_token_ids=int_list(body.get("token_ids")),
            completion_logprobs=logprob_list(body.get("logprobs")),
        )

    def accumulator(self, client_wants_usage: bool) -> StreamAccumulator:
        return _AnthropicStream(self)

    def error_body(self, status: int, message: str) -> JSON:
        kind = _ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
        return {"type": "error", "error": {"type": kind, "message": message}}


class _AnthropicStream(StreamAccumulator):
    def __init__(self, dialect: AnthropicDialect) -> None:
        self.dialect = dialect
        self.message: JSON | None = None
        self.blocks: dict[int, JSON] = {}
        self.partial_json: dict[int, list[str]] = {}
        self.usage: JSON = {}
        self.stop_reason: Any = None
        self.error: str | None = None
        self.token_ids: list[int] | None = None
        self.logprobs: list[float] | None = None

    def feed(self, event: SSEEvent) -> Action:
        data = event.json()
        if data is None:
            return Action.RELAY
        kind = data.get("type", event.event)
        index = as_int(data.get("index"))
        if kind == "message_start" and isinstance(data.get("message"), dict):
            self.message = data["message"]
            self.usage.update(self.message.get("usage") or {})
        elif kind == "content_block_start" and isinstance(data.get("content_block"), dict):
            self.blocks[index] = dict(data["content_block"])
        elif kind == "content_block_delta" and isinstance(data.get("delta"), dict):
            self._delta(index, data["delta"])
        elif kind == "content_block_stop" and index in self.partial_json:
            text = "".join(self.partial_json.pop(index))
            try:
                self.blocks[index]["input"] = json.loads(text) if text else {}
            except ValueError:
                self.blocks[index]["input"] = text
        elif kind == "message_delta":
            delta = data.get("delta")
            if isinstance(delta, dict) and delta.get("stop_reason") is not None:
                self.stop_reason = delta["stop_reason"]
            if isinstance(data.get("usage"), dict):
                self.usage.update({k: v for k, v in data["usage"].items() if v is not None})
            # Token ids/logprobs ride on message_delta when the server returns them (vLLM-style).
            self.token_ids = int_list(data.get("token_ids")) or self.token_ids
            self.logprobs = logprob_list(data.get("logprobs")) or self.logprobs
        elif kind == "error":
            self.error = str(data.get("error") or data)[:2000]
        elif kind == "message_stop":
            return Action.HOLD
        return Action.RELAY

    def _delta(self, index: int, delta: JSON) -> None:
        block = self.blocks.setdefault(index, {"type": "text", "text": ""})
        kind = delta.get("type")
        if kind == "text_delta":
            block["text"] = str(block.get("text") or "") + str(delta.get("text") or "")
        elif kind == "thinking_delta":
            block["thinking"] = str(block.get("thinking") or "") + str(delta.get("thinking") or "")
        elif kind == "input_json_delta":
            self.partial_json.setdefault(index, []).append(str(delta.get("partial_json") or ""))

    def result(self) -> ParsedResponse:
        if self.message is None:
            return ParsedResponse(message=None, error=self.error)
        content = [self.blocks[i] for i in sorted(self.blocks)]
        role = self.message.get("role") if isinstance(self.message.get("role"), str) else None
        messages = _blocks_to_message(str(role or "assistant"), content, "content")
        return ParsedResponse(
            message=messages[-1],
            usage=_usage(self.usage),
            finish_reason=_finish(self.stop_reason),
            prompt_token_ids=int_list(self.message.get("prompt_token_ids")),
            completion_token_ids=self.token_ids,
            completion_logprobs=self.logprobs,
            error=self.error,
        )
