"""The OpenAI Responses dialect (``POST /v1/responses``): input and output items as chat messages.

An assistant ``message`` item, the ``function_call`` (and ``custom_tool_call``) items and
``reasoning`` that follow it fold into one assistant chat message; a ``function_call_output`` (or
``custom_tool_call_output``) is a ``tool`` message. A part list's
``input_text`` parts are recorded as chat ``text`` parts and its ``input_image`` parts (a URL or a
data URL) as chat ``image_url`` parts. Request input and response output use the same folding, so
a reply sent back as input keeps its content id.
"""

from __future__ import annotations

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
    openai_error,
    require,
    tool_call,
)
from vfray.interception.dialects.prefix import PrefixCache
from vfray.trace import Message, Usage, content_text

SAMPLING_KEYS = frozenset(
    {"temperature", "top_p", "max_output_tokens", "reasoning", "top_logprobs", "seed", "text"}
)
_LOGPROBS = "message.output_text.logprobs"
FINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})
_ITEM_NOISE = frozenset({"id", "status", "type"})


def _text_parts(content: Any) -> Any:
    if isinstance(content, list):
        cleaned = []
        for part in content:
            if isinstance(part, dict):
                part = {k: v for k, v in part.items() if k != "annotations" and v is not None}
            cleaned.append(part)
        return cleaned
    return content


def items_to_messages(items: list[Any], where: str) -> list[Message]:
    """Fold Responses items into chat messages (see the module docstring)."""
    return _fold_items(items, 0, 0, where)[0]


def _open_assistant(out: list[JSON]) -> bool:
    """Whether the next assistant-side item joins the last message instead of starting one."""
    return bool(out) and out[-1].get("role") == "assistant" and not out[-1].get("_closed")


def _fold_items(
    items: list[Any], start: int, offset: int, where: str
) -> tuple[list[Message], list[int]]:
    """Fold ``items[start:]`` (a :data:`~vfray.interception.dialects.prefix.Fold`): a boundary
    is a restart point unless it leaves an assistant message open for the next items."""
    out: list[JSON] = []
    marks: list[int] = []

    def assistant() -> JSON:
        if not _open_assistant(out):
            out.append({"role": "assistant", "content": None})
        return out[-1]

    for i in range(start, len(items)):
        item = items[i]
        require(isinstance(item, dict), f"{where}[{i}] must be an object")
        kind = item.get("type", "message")
        if kind == "message" or (kind is None and "role" in item):
            require(isinstance(item.get("role"), str), f"{where}[{i}].role must be a string")
            raw = {k: v for k, v in item.items() if k not in _ITEM_NOISE}
            raw["content"] = _text_parts(item.get("content"))
            if raw["role"] == "assistant":
                target = assistant()
                target["content"] = content_text(raw["content"]) or target.get("content")
            else:
                out.append(raw)
        elif kind == "function_call":
            target = assistant()
            calls = target.setdefault("tool_calls", [])
            calls.append(tool_call(item.get("call_id"), item.get("name"), item.get("arguments")))
        elif kind == "reasoning":
            summary = item.get("summary")
            text = content_text(summary) if isinstance(summary, list) else ""
            target = assistant()
            if text:
                target["reasoning_content"] = (target.get("reasoning_content") or "") + text
        elif kind == "custom_tool_call":
            # A custom tool's call (Codex's apply_patch with GPT-5): free text, not JSON
            # arguments; recorded as the chat dialect records one.
            target = assistant()
            calls = target.setdefault("tool_calls", [])
            name, text = item.get("name"), item.get("input")
            calls.append(
                {
                    "id": str(item.get("call_id") or ""),
                    "type": "custom",
                    "custom": {"name": str(name or ""), "input": str(text or "")},
                }
            )
        elif kind in ("function_call_output", "custom_tool_call_output"):
            output = item.get("output")
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": item.get("call_id"),
                    "content": output if isinstance(output, str) else _text_parts(output),
                }
            )
        else:
            # Items vfray has no chat form for (item_reference, web_search_call, ...) are kept
            # whole, under their type as the role, rather than rejected or silently dropped.
            require(isinstance(kind, str), f"{where}[{i}].type must be a string")
            out.append({"role": kind, "content": {k: v for k, v in item.items() if k != "id"}})
        marks.append(-1 if _open_assistant(out) else len(out))
    messages = [chat_message(m, f"{where}[{offset + j}]") for j, m in enumerate(out)]
    return messages, marks


def _input_fold(items: list[Any], start: int, offset: int) -> tuple[list[Message], list[int]]:
    return _fold_items(items, start, offset, "input")


def _usage(raw: Any) -> Usage:
    if not isinstance(raw, dict):
        return Usage()
    return Usage(
        input_tokens=as_int(raw.get("input_tokens")),
        output_tokens=as_int(raw.get("output_tokens")),
    )


def _output_logprobs(output: list[Any]) -> list[float] | None:
    """Logprobs of the ``output_text`` parts, in order (Responses puts them on each part)."""
    found: list[float] | None = None
    for item in output:
        parts = item.get("content") if isinstance(item, dict) else None
        for part in parts if isinstance(parts, list) else []:
            entries = part.get("logprobs") if isinstance(part, dict) else None
            values = logprob_list({"content": entries}) if entries else None
            if values is not None:
                found = (found or []) + values
    return found


def _finish_reason(body: JSON, message: Message | None) -> str | None:
    status = body.get("status")
    if status == "incomplete":
        details = body.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, dict) else None
        return "length" if reason == "max_output_tokens" else str(reason or "incomplete")
    if status == "failed":
        return "error"
    if message is not None and message.tool_calls:
        return "tool_calls"
    return "stop" if status in ("completed", None) else str(status)


class ResponsesDialect(Dialect):
    name = "responses"
    # Codex retries 401, 403 and 404 five times (~7 s) and gives up at once on 400.
    final_status = 400
    path = "/responses"
    sampling_keys = SAMPLING_KEYS

    def token_fields(self, body: JSON) -> JSON:
        # Output logprobs are an ``include`` item here; the client's own items are kept.
        include = body.get("include")
        items = [i for i in include if i != _LOGPROBS] if isinstance(include, list) else []
        return {"return_token_ids": True, "include": [*items, _LOGPROBS]}

    def parse_request(self, body: JSON, cache: PrefixCache | None = None) -> ParsedRequest:
        raw_input = body.get("input")
        require(isinstance(raw_input, (str, list)), "'input' must be a string or a list of items")
        messages: list[Message] = []
        instructions = body.get("instructions")
        require(
            instructions is None or isinstance(instructions, str), "'instructions' must be a string"
        )
        if instructions:
            messages.append(
                Message(role="system", content=instructions)
                if cache is None
                else cache.system(instructions)
            )
        if isinstance(raw_input, str):
            messages.append(Message(role="user", content=raw_input))
        elif isinstance(raw_input, list):
            messages.extend(self.parse_items(raw_input, _input_fold, cache))
        tools = body.get("tools")
        require(
            tools is None or (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)),
            "'tools' must be a list of objects",
        )
        stream = body.get("stream", False)
        require(isinstance(stream, bool), "'stream' must be a boolean")
        return ParsedRequest(messages=messages, tools=tools, stream=stream)

    def impose(self, body: JSON, model: str, sampling: Mapping[str, Any]) -> JSON:
        renamed = {
            ("max_output_tokens" if k == "max_tokens" else k): v for k, v in sampling.items()
        }
        return super().impose(body, model, renamed)

    def parse_response(self, body: JSON) -> ParsedResponse:
        output = body.get("output")
        if not isinstance(output, list):
            raise ValueError("response without an 'output' list")
        messages = items_to_messages(output, "output")
        message = messages[-1] if messages else None
        return ParsedResponse(
            message=message,
            usage=_usage(body.get("usage")),
            finish_reason=_finish_reason(body, message),
            prompt_token_ids=int_list(body.get("prompt_token_ids")),
            completion_token_ids=int_list(body.get("token_ids")),
            completion_logprobs=_output_logprobs(output),
        )

    def accumulator(self, client_wants_usage: bool) -> StreamAccumulator:
        return _ResponsesStream(self)

    def error_body(self, status: int, message: str) -> JSON:
        return openai_error(status, message)


_KEPT_EVENTS = frozenset({"response.output_item.done", "error", *FINAL_EVENTS})
"""The stream events whose data :class:`_ResponsesStream` reads."""


class _ResponsesStream(StreamAccumulator):
    def __init__(self, dialect: ResponsesDialect) -> None:
        self.dialect = dialect
        self.items: list[Any] = []
        self.final: ParsedResponse | None = None
        self.error: str | None = None

    def feed(self, event: SSEEvent) -> Action:
        if event.event is not None and event.event not in _KEPT_EVENTS:
            # A delta, named on its event: line. Relayed unparsed (most of a stream's events;
            # the final event carries the whole response).
            return Action.RELAY
        data = event.json()
        kind = event.event or (data or {}).get("type")
        if data is None:
            return Action.RELAY
        if kind == "response.output_item.done" and isinstance(data.get("item"), dict):
            self.items.append(data["item"])
        elif kind == "error":
            self.error = str(data.get("message") or data)[:2000]
        elif kind in FINAL_EVENTS:
            response = data.get("response")
            if isinstance(response, dict):
                self.final = self.dialect.parse_response(response)
            return Action.HOLD
        return Action.RELAY

    def result(self) -> ParsedResponse:
        if self.final is not None:
            self.final.error = self.error
            return self.final
        messages = items_to_messages(self.items, "output") if self.items else []
        message = messages[-1] if messages else None
        return ParsedResponse(message=message, finish_reason=None, error=self.error)
