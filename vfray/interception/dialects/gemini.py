"""The Gemini dialect (``POST /v1beta/models/{model}:generateContent`` and
``:streamGenerateContent?alt=sse``), translated to and from OpenAI chat completions upstream.

Gemini's API is served by no open inference server, so unlike the other dialects this one does
not relay the provider's bytes: a request's ``contents`` become chat messages (``model`` turns
``assistant``, ``functionCall`` parts tool calls, ``functionResponse`` parts ``tool`` messages,
``thought`` parts reasoning), ``systemInstruction`` the system message, ``functionDeclarations``
chat tools and ``generationConfig`` chat sampling; the chat reply (or each chunk of its stream)
is answered in Gemini's shape. The trace records the chat form, as the other dialects do.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from vfray.interception.dialects.base import (
    JSON,
    Action,
    ParsedRequest,
    ParsedResponse,
    SSEEvent,
    StreamAccumulator,
    chat_message,
    require,
    tool_call,
    upstream_error_message,
)
from vfray.interception.dialects.chat import ChatDialect
from vfray.interception.dialects.prefix import PrefixCache
from vfray.trace import Message, canonical_json

PREFIXES = ("/v1beta/models/", "/v1/models/")
METHODS = ("generateContent", "streamGenerateContent", "countTokens")
_GENERATION_KEYS = {
    "temperature": "temperature",
    "topP": "top_p",
    "topK": "top_k",
    "maxOutputTokens": "max_tokens",
    "stopSequences": "stop",
    "seed": "seed",
    "presencePenalty": "presence_penalty",
    "frequencyPenalty": "frequency_penalty",
    "candidateCount": "n",
}
_FINISH = {"stop": "STOP", "tool_calls": "STOP", "length": "MAX_TOKENS"}
_FINISH["content_filter"] = "SAFETY"
_STATUSES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    408: "DEADLINE_EXCEEDED",
    409: "ABORTED",
    413: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
_MODES = {"AUTO": "auto", "ANY": "required", "NONE": "none"}


def gemini_method(path: str) -> str | None:
    """``generateContent``/``streamGenerateContent``/``countTokens`` for a Gemini model route
    (``/v1beta/models/NAME:METHOD``), or None for any other path."""
    for prefix in PREFIXES:
        if path.startswith(prefix):
            model, _, method = path[len(prefix) :].rpartition(":")
            return method if model and method in METHODS else None
    return None


def _schema(value: Any) -> Any:
    # Gemini's OpenAPI subset names types in capitals ("OBJECT"); JSON Schema in lower case.
    if isinstance(value, dict):
        return {
            k: (v.lower() if k == "type" and isinstance(v, str) else _schema(v))
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_schema(v) for v in value]
    return value


def _tools(raw: Any) -> list[JSON] | None:
    require(raw is None or isinstance(raw, list), "'tools' must be a list of objects")
    tools: list[JSON] = []
    for i, group in enumerate(raw or []):
        require(isinstance(group, dict), f"tools[{i}] must be an object")
        declarations = group.get("functionDeclarations") or []
        require(isinstance(declarations, list), f"tools[{i}].functionDeclarations must be a list")
        for j, fn in enumerate(declarations):
            where = f"tools[{i}].functionDeclarations[{j}]"
            require(isinstance(fn, dict) and isinstance(fn.get("name"), str), f"{where}.name")
            schema = fn.get("parametersJsonSchema")
            if schema is None:
                schema = _schema(fn.get("parameters")) or {"type": "object", "properties": {}}
            function: JSON = {"name": fn["name"], "parameters": schema}
            if isinstance(fn.get("description"), str):
                function["description"] = fn["description"]
            tools.append({"type": "function", "function": function})
    return tools or None


def _response_text(response: Any) -> Any:
    # gemini-cli answers {"output": text} (or {"error": text}); anything else stays JSON.
    if isinstance(response, dict) and len(response) == 1:
        (value,) = response.values()
        if isinstance(value, str):
            return value
    return canonical_json(response if response is not None else {})


class _Fold:
    """Turns ``contents`` into chat messages; a call without an id gets one its response (the
    next ``functionResponse`` of that name) is matched to."""

    def __init__(self) -> None:
        self.waiting: dict[str, list[str]] = {}
        self.count = 0

    def content(self, raw: Any, where: str) -> list[Message]:
        require(isinstance(raw, dict), f"{where} must be an object")
        role = raw.get("role") or "user"
        require(isinstance(role, str), f"{where}.role must be a string")
        parts = raw.get("parts")
        require(isinstance(parts, list), f"{where}.parts must be a list")
        assert isinstance(parts, list)
        texts: list[JSON] = []
        thoughts: list[str] = []
        calls: list[JSON] = []
        results: list[Message] = []
        for i, part in enumerate(parts):
            at = f"{where}.parts[{i}]"
            require(isinstance(part, dict), f"{at} must be an object")
            if isinstance(part.get("functionCall"), dict):
                calls.append(self._call(part["functionCall"]))
            elif isinstance(part.get("functionResponse"), dict):
                results.append(self._result(part["functionResponse"], at))
            elif isinstance(part.get("text"), str):
                if part.get("thought"):
                    thoughts.append(part["text"])
                else:
                    texts.append({"type": "text", "text": part["text"]})
            elif isinstance(part.get("inlineData"), dict):
                data = part["inlineData"]
                url = f"data:{data.get('mimeType')};base64,{data.get('data')}"
                texts.append({"type": "image_url", "image_url": {"url": url}})
            else:
                # A bare thoughtSignature part carries nothing the model would see.
                unknown = sorted(k for k in part if k != "thoughtSignature")
                require(not unknown, f"{at}: unsupported part {unknown}")
        messages = results
        if texts or calls or thoughts or not results:
            fields: JSON = {"role": "assistant" if role == "model" else role}
            fields["content"] = texts or None  # text-only parts are recorded as one string
            if calls:
                fields["tool_calls"] = calls
            if thoughts:
                fields["reasoning_content"] = "".join(thoughts)
            messages = [*results, chat_message(fields, where)]
        return messages

    def _call(self, call: JSON) -> JSON:
        name = str(call.get("name") or "")
        call_id = call.get("id")
        if not isinstance(call_id, str) or not call_id:
            call_id = f"call_{self.count}"
            self.waiting.setdefault(name, []).append(call_id)
        self.count += 1
        return tool_call(call_id, name, call.get("args") or {})

    def _result(self, result: JSON, where: str) -> Message:
        name = str(result.get("name") or "")
        call_id = result.get("id")
        if not isinstance(call_id, str) or not call_id:
            waiting = self.waiting.get(name) or [f"call_{name}"]
            call_id = waiting.pop(0)
        fields = {"role": "tool", "tool_call_id": call_id, "name": name or None}
        return chat_message({**fields, "content": _response_text(result.get("response"))}, where)


def contents_messages(body: JSON) -> list[Message]:
    """A request's ``systemInstruction`` and ``contents`` as chat messages."""
    contents = body.get("contents")
    require(isinstance(contents, list), "'contents' must be a list of contents")
    assert isinstance(contents, list)
    fold = _Fold()
    messages: list[Message] = []
    system = body.get("systemInstruction")
    if system is not None:
        if isinstance(system, str):
            system = {"parts": [{"text": system}]}
        (message,) = fold.content({**system, "role": "system"}, "systemInstruction")
        messages.append(message)
    for i, content in enumerate(contents):
        messages.extend(fold.content(content, f"contents[{i}]"))
    return messages


def counted_fields(body: JSON) -> JSON:
    """What ``countTokens`` counts (``contents``, and a ``generateContentRequest``'s system
    instruction and tools), in the fields :func:`vfray.interception.count_tokens.estimate`
    reads; checked as a request would be."""
    request = body.get("generateContentRequest")
    request = request if isinstance(request, dict) else body
    contents_messages(request)
    _tools(request.get("tools"))
    fields = ("systemInstruction", "system"), ("contents", "messages"), ("tools", "tools")
    return {ours: request[theirs] for theirs, ours in fields if request.get(theirs) is not None}


def _parts(message: Message | None) -> list[JSON]:
    if message is None:
        return []
    parts: list[JSON] = []
    if message.reasoning_content:
        parts.append({"text": message.reasoning_content, "thought": True})
    if message.text:
        parts.append({"text": message.text})
    for call in message.tool_calls or []:
        fn = call.get("function") or {}
        try:
            args = json.loads(fn.get("arguments") or "{}")
        except ValueError:
            args = {}
        part = {"name": fn.get("name", ""), "args": args if isinstance(args, dict) else {}}
        parts.append({"functionCall": {"id": call.get("id") or None, **part}})
    return parts


def _as_sent_back(reply: ParsedResponse) -> ParsedResponse:
    """``reply`` with each tool call's arguments as the client will send them back (an ``args``
    object, which becomes canonical JSON): recorded so, the next call extends its branch."""
    message = reply.message
    if message is None or not message.tool_calls:
        return reply
    calls = []
    for call in message.tool_calls:
        fn = call.get("function") or {}
        try:
            args = json.loads(fn.get("arguments") or "{}")
        except ValueError:
            args = {}
        calls.append(
            tool_call(call.get("id"), fn.get("name"), args if isinstance(args, dict) else {})
        )
    reply.message = message.model_copy(update={"tool_calls": calls})
    return reply


def _usage(reply: ParsedResponse) -> JSON:
    usage = reply.usage
    return {
        "promptTokenCount": usage.input_tokens,
        "candidatesTokenCount": usage.output_tokens,
        "totalTokenCount": usage.input_tokens + usage.output_tokens,
    }


def _candidate(parts: list[JSON], finish: str | None) -> JSON:
    candidate: JSON = {"content": {"role": "model", "parts": parts}, "index": 0}
    if finish is not None:
        candidate["finishReason"] = _FINISH.get(finish, "OTHER")
    return candidate


def gemini_reply(reply: ParsedResponse, model: str) -> JSON:
    """A ``GenerateContentResponse`` for a (normalized) chat reply."""
    return {
        "candidates": [_candidate(_parts(reply.message), reply.finish_reason or "stop")],
        "usageMetadata": _usage(reply),
        "modelVersion": model,
    }


def _sse(body: JSON) -> bytes:
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\r\n\r\n"


class GeminiDialect(ChatDialect):
    """Gemini on the client side, chat completions upstream; one instance per method, as
    Gemini says in the path, not the body, whether to stream."""

    name = "gemini"
    # gemini-cli retries 429 and 5xx with backoff, and gives up at once on any other 4xx.
    final_status = 403

    def __init__(self, stream: bool = False) -> None:
        self.stream = stream

    def parse_request(self, body: JSON, cache: PrefixCache | None = None) -> ParsedRequest:
        messages = contents_messages(body)
        return ParsedRequest(messages=messages, tools=_tools(body.get("tools")), stream=self.stream)

    def impose(self, body: JSON, model: str, sampling: Mapping[str, Any]) -> JSON:
        parsed = self.parse_request(body)
        chat: JSON = {
            "model": model,
            "messages": [m.model_dump(exclude_none=True) for m in parsed.messages],
            "stream": self.stream,
        }
        if parsed.tools:
            chat["tools"] = parsed.tools
            config = (body.get("toolConfig") or {}).get("functionCallingConfig") or {}
            mode = _MODES.get(str(config.get("mode", "")).upper())
            if mode is not None:
                chat["tool_choice"] = mode
        generation = body.get("generationConfig")
        if isinstance(generation, dict):
            for key, value in generation.items():
                if key in _GENERATION_KEYS and value is not None:
                    chat[_GENERATION_KEYS[key]] = value
            schema = generation.get("responseJsonSchema") or generation.get("responseSchema")
            if generation.get("responseMimeType") == "application/json":
                chat["response_format"] = (
                    {"type": "json_schema", "json_schema": {"name": "response", "schema": schema}}
                    if schema
                    else {"type": "json_object"}
                )
        return super().impose(chat, model, sampling)

    def client_wants_usage(self, body: JSON) -> bool:
        return True  # every Gemini answer carries its usageMetadata

    def parse_response(self, body: JSON) -> ParsedResponse:
        return _as_sent_back(super().parse_response(body))

    def client_reply(self, data: bytes, reply: ParsedResponse, model: str) -> bytes:
        return json.dumps(gemini_reply(reply, model)).encode()

    def client_error(self, status: int, data: bytes) -> bytes:
        message = upstream_error_message(data)
        text = message if isinstance(message, str) else data.decode("utf-8", "replace")
        return json.dumps(self.error_body(status, text[:2000])).encode()

    def accumulator(self, client_wants_usage: bool) -> StreamAccumulator:
        return _GeminiStream(super().accumulator(True))

    def error_body(self, status: int, message: str) -> JSON:
        kind = _STATUSES.get(status, "INVALID_ARGUMENT" if status < 500 else "INTERNAL")
        return {"error": {"code": status, "message": message, "status": kind}}


class _GeminiStream(StreamAccumulator):
    """The chat stream's accumulator, each event answered as a Gemini chunk: text and thoughts
    as they come, tool calls (whose arguments stream in pieces) whole in the final chunk, sent
    on ``[DONE]`` with the finish reason and usage."""

    def __init__(self, chat: StreamAccumulator) -> None:
        self.chat = chat
        self.out = b""

    def feed(self, event: SSEEvent) -> Action:
        action = self.chat.feed(event)
        self.out = b""
        if event.data.strip() == "[DONE]":
            reply = self.result()
            calls = [p for p in _parts(reply.message) if "functionCall" in p]
            final = _candidate(calls, reply.finish_reason or "stop")
            self.out = _sse({"candidates": [final], "usageMetadata": _usage(reply)})
            return action
        chunk = event.json()
        choices = chunk.get("choices") if chunk else None
        if not choices or not isinstance(choices[0], dict):
            return action
        delta = choices[0].get("delta") or {}
        parts: list[JSON] = []
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            parts.append({"text": reasoning, "thought": True})
        if isinstance(delta.get("content"), str) and delta["content"]:
            parts.append({"text": delta["content"]})
        if parts:
            self.out = _sse({"candidates": [_candidate(parts, None)]})
        return action

    def rewrite(self, block: bytes) -> bytes:
        # The chunk made from the event just fed, once; a stream's unfinished rest gets nothing.
        out, self.out = self.out, b""
        return out

    def result(self) -> ParsedResponse:
        return _as_sent_back(self.chat.result())
