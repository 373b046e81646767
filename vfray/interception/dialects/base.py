"""What every wire dialect provides: request/response normalization, SSE handling, error shapes.

A dialect turns one provider's JSON into vfray's normalized chat :class:`~vfray.trace.Message`s
(OpenAI chat shape, canonicalized so a reply and the same message sent back next turn get the
same content id), imposes the eval's model and sampling, and knows its own error body shape.
"""

from __future__ import annotations

import enum
import json
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import TypeAdapter, ValidationError

from vfray.interception.dialects.prefix import Fold, PrefixCache
from vfray.trace import Message, Usage, canonical_json, content_text

JSON = dict[str, Any]

# Fields that are noise when null/empty in provider replies; dropping them keeps a reply and the
# copy the client sends back next turn content-identical, so the branch grows instead of forking.
_CORE_FIELDS = ("role", "content", "name", "tool_calls", "tool_call_id", "reasoning_content")


class DialectError(ValueError):
    """The body does not fit the dialect; the message says what is wrong (answered 400)."""


class Action(enum.Enum):
    """What the proxy does with one upstream SSE event."""

    RELAY = "relay"
    HOLD = "hold"  # a final event: sent only after the turn is recorded
    DROP = "drop"  # an event the client did not ask for (e.g. a usage chunk vfray requested)


@dataclass
class ParsedRequest:
    """A client request in normalized form."""

    messages: list[Message]
    tools: list[JSON] | None
    stream: bool


@dataclass
class ParsedResponse:
    """A model reply in normalized form, with token ids/logprobs exactly as returned."""

    message: Message | None
    usage: Usage = field(default_factory=Usage)
    finish_reason: str | None = None
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    completion_logprobs: list[float] | None = None
    error: str | None = None
    """An error the upstream reported inside an otherwise successful (streamed) reply."""


@dataclass
class SSEEvent:
    """One server-sent event: its raw bytes (relayed verbatim), event name and data."""

    raw: bytes
    event: str | None
    data: str

    def json(self) -> JSON | None:
        """The data parsed as a JSON object, or None (``[DONE]``, comments, junk)."""
        try:
            value = json.loads(self.data)
        except ValueError:
            return None
        return value if isinstance(value, dict) else None


def parse_sse_block(raw: bytes) -> SSEEvent:
    """One event block (``\r\n`` already made ``\n``, as :class:`SSESplitter` gives them)."""
    # The shapes every provider streams, read without a walk of the lines: one data line
    # (chat completions), or an event line then one data line (Responses, Anthropic).
    lines = raw.count(b"\n")
    if lines == 2 and raw.startswith(b"data: ") and raw.endswith(b"\n\n"):
        return SSEEvent(raw=raw, event=None, data=raw[6:-2].decode("utf-8", "replace"))
    if lines == 3 and raw.startswith(b"event: ") and raw.endswith(b"\n\n"):
        end = raw.index(b"\n")
        if raw.startswith(b"data: ", end + 1):
            name = raw[7:end].decode("utf-8", "replace").strip()
            return SSEEvent(raw=raw, event=name, data=raw[end + 7 : -2].decode("utf-8", "replace"))
    event: str | None = None
    data: list[str] = []
    # Lines end at \n (or a lone \r), as the SSE format says: not at every line break
    # str.splitlines knows (U+2028 and others may stand unescaped in a JSON string).
    for line in raw.decode("utf-8", "replace").replace("\r", "\n").split("\n"):
        if line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
    return SSEEvent(raw=raw, event=event, data="\n".join(data))


class SSESplitter:
    """Splits a byte stream into SSE event blocks (each returned with its blank-line end)."""

    def __init__(self) -> None:
        self._buffer = b""
        self._cr = False
        """The last chunk ended with a CR, held back: half of a CRLF if the next starts LF."""

    def feed(self, chunk: bytes) -> list[bytes]:
        # A large event spans reads, and sse-starlette ends lines with CRLF: a read ending
        # between a CR and its LF kept the halves apart, so no event ever ended. The CR waits
        # for the next read, and each byte is normalized exactly once.
        if self._cr:
            chunk, self._cr = b"\r" + chunk, False
        if chunk.endswith(b"\r"):
            chunk, self._cr = chunk[:-1], True
        chunk = chunk.replace(b"\r\n", b"\n")
        # One split, not a find and a copy of the rest per event (a chunk holds many events).
        parts = (self._buffer + chunk if self._buffer else chunk).split(b"\n\n")
        self._buffer = parts.pop()
        return [part + b"\n\n" for part in parts]

    def rest(self) -> bytes:
        rest = self._buffer + (b"\r" if self._cr else b"")
        self._buffer, self._cr = b"", False
        return rest


class StreamAccumulator(ABC):
    """Builds the normalized reply of a stream as its events pass through."""

    @abstractmethod
    def feed(self, event: SSEEvent) -> Action: ...

    @abstractmethod
    def result(self) -> ParsedResponse: ...

    def rewrite(self, block: bytes) -> bytes:
        """What the client gets for the event just fed (or for a stream's unfinished rest): the
        upstream's bytes as they are, unless the dialect translates (Gemini)."""
        return block


class Dialect(ABC):
    """One wire format: OpenAI chat completions, OpenAI Responses or Anthropic Messages."""

    name: str
    path: str
    sampling_keys: frozenset[str]
    """Request fields recorded as the call's sampling parameters."""
    final_status: int = 400
    """The status of a refusal no retry can change (the rollout stopped or concluded, the key
    unknown): one this dialect's known agents give up on at once rather than retry for
    minutes (measured per agent, see each dialect)."""

    @abstractmethod
    def parse_request(self, body: JSON, cache: PrefixCache | None = None) -> ParsedRequest:
        """Normalize a request; with the session's ``cache``, a repeated history is not parsed
        again (the result is the same either way)."""

    def parse_items(self, items: list[Any], fold: Fold, cache: PrefixCache | None) -> list[Message]:
        """``fold(items, 0, 0)``'s messages, through ``cache`` when there is one."""
        if cache is None:
            return fold(items, 0, 0)[0]
        return cache.parse(self.name, items, fold)

    @abstractmethod
    def parse_response(self, body: JSON) -> ParsedResponse: ...

    @abstractmethod
    def accumulator(self, client_wants_usage: bool) -> StreamAccumulator: ...

    @abstractmethod
    def error_body(self, status: int, message: str) -> JSON: ...

    def client_reply(self, data: bytes, reply: ParsedResponse, model: str) -> bytes:
        """The body the client gets for a 2xx JSON ``reply``: the upstream's own ``data``, unless
        the dialect translates (Gemini, answered from a chat-completions upstream)."""
        return data

    def client_error(self, status: int, data: bytes) -> bytes:
        """The body the client gets for an upstream error: relayed as it is, unless the dialect
        translates."""
        return data

    token_request: JSON = {"return_token_ids": True}
    """Fields that ask the endpoint for the prompt's and the completion's token ids and the
    sampled tokens' logprobs (vLLM's extension fields), added when the sampling config says
    ``return_tokens``."""

    def impose(self, body: JSON, model: str, sampling: Mapping[str, Any]) -> JSON:
        """The body to forward: the eval's model and sampling override the client's choice."""
        out = dict(body)
        out["model"] = model
        params = dict(sampling)
        if params.pop("return_tokens", None):
            out.update(self.token_fields(body))
        out.update(params)
        return out

    def token_fields(self, body: JSON) -> JSON:
        """:attr:`token_request`, merged with what ``body`` already asks for."""
        return dict(self.token_request)

    def client_wants_usage(self, body: JSON) -> bool:
        return True

    def upstream_headers(self, api_key: str | None, client: Mapping[str, str]) -> dict[str, str]:
        headers = {"content-type": "application/json"}
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        return headers

    def recorded_sampling(self, body: JSON) -> JSON:
        return {k: body[k] for k in sorted(self.sampling_keys) if k in body}


def openai_error(status: int, message: str) -> JSON:
    kind = {
        401: "authentication_error",
        403: "permission_denied",
        404: "not_found_error",
        409: "conflict_error",
        413: "request_too_large",
        429: "rate_limit_error",
        502: "upstream_error",
        503: "upstream_unavailable",
        504: "upstream_timeout",
    }.get(status, "invalid_request_error" if status < 500 else "server_error")
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


def upstream_error_message(data: bytes) -> Any:
    """An upstream error body's ``error.message`` (or its bare ``error``), for a dialect that
    re-words the error in its client's shape; None when the body is not a JSON object."""
    try:
        error = json.loads(data).get("error")
        return error.get("message") if isinstance(error, dict) else error
    except (ValueError, AttributeError):
        return None


def require(condition: bool, message: str) -> None:
    if not condition:
        raise DialectError(message)


def tool_call(call_id: Any, name: Any, arguments: Any) -> JSON:
    """A tool call in canonical chat shape (arguments always a JSON string)."""
    if not isinstance(arguments, str):
        arguments = canonical_json(arguments if arguments is not None else {})
    return {
        "id": str(call_id) if call_id is not None else "",
        "type": "function",
        "function": {"name": str(name) if name is not None else "", "arguments": arguments},
    }


def image_part(url: str, detail: Any = None) -> JSON:
    """An image as a chat ``image_url`` part, the one shape every dialect records (``detail``
    kept unless it is the default ``auto``, so the same image is the same part everywhere)."""
    source: JSON = {"url": url}
    if isinstance(detail, str) and detail != "auto":
        source["detail"] = detail
    return {"type": "image_url", "image_url": source}


def _canonical_part(part: Any) -> Any:
    """One content part in chat shape: Responses ``input_image`` (a URL or data URL), Anthropic
    ``image`` blocks (a ``base64`` or ``url`` source) and chat ``image_url`` parts become
    :func:`image_part`; Responses text parts become ``text``. Anything else (a ``file_id``
    image, a document) is kept as sent."""
    if not isinstance(part, dict):
        return part
    kind = part.get("type")
    if kind in ("input_text", "output_text") and isinstance(part.get("text"), str):
        return {"type": "text", "text": part["text"]}
    if kind == "input_image" and isinstance(part.get("image_url"), str):
        return image_part(part["image_url"], part.get("detail"))
    if kind == "image_url":
        source = part.get("image_url")
        if isinstance(source, str):
            return image_part(source)
        if isinstance(source, dict) and isinstance(source.get("url"), str):
            return image_part(source["url"], source.get("detail"))
    if kind == "image" and isinstance(part.get("source"), dict):
        source = part["source"]
        if source.get("type") == "url" and isinstance(source.get("url"), str):
            return image_part(source["url"])
        media, data = source.get("media_type"), source.get("data")
        if source.get("type") == "base64" and isinstance(media, str) and isinstance(data, str):
            return image_part(f"data:{media};base64,{data}")
    return part


def _canonical_content(content: Any) -> Any:
    # A text-only part list and the plain string are the same message for training purposes.
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") in ("text", "input_text", "output_text")
        for p in content
    ):
        return content_text(content)
    if isinstance(content, list):
        return [_canonical_part(p) for p in content]
    return content


def chat_message(raw: Any, where: str) -> Message:
    """Normalize one OpenAI-chat-shaped message dict into a canonical :class:`Message`."""
    require(isinstance(raw, dict), f"{where} must be an object")
    role = raw.get("role")
    require(isinstance(role, str) and role != "", f"{where}.role must be a non-empty string")
    fields: JSON = {"role": role}
    content = _canonical_content(raw.get("content"))
    if content not in (None, "") or role != "assistant":
        fields["content"] = content
    name = raw.get("name")
    if isinstance(name, str):
        fields["name"] = name
    calls = raw.get("tool_calls")
    if calls:
        require(isinstance(calls, list), f"{where}.tool_calls must be a list")
        normalized = []
        for i, call in enumerate(calls):
            require(isinstance(call, dict), f"{where}.tool_calls[{i}] must be an object")
            fn = call.get("function")
            if not isinstance(fn, dict) and call.get("type") not in (None, "function"):
                # A call of another kind (GPT-5's "custom" tools: free text in custom.input)
                # is kept whole: made a function call, its name and input were dropped.
                normalized.append(dict(call))
                continue
            fn = fn if isinstance(fn, dict) else {}
            normalized.append(tool_call(call.get("id"), fn.get("name"), fn.get("arguments")))
        fields["tool_calls"] = normalized
    if raw.get("tool_call_id") is not None:
        fields["tool_call_id"] = str(raw["tool_call_id"])
    reasoning = raw.get("reasoning_content") or raw.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        fields["reasoning_content"] = reasoning
    for key, value in raw.items():
        if key not in _CORE_FIELDS and key != "reasoning" and value not in (None, "", [], {}):
            fields[key] = value
    return Message(**fields)


_TOKEN_IDS = TypeAdapter(list[int])


def int_list(value: Any) -> list[int] | None:
    """``value`` as a new list when it is a list of ints (token ids: no bools, no floats), else
    None."""
    # Checked in pydantic's Rust, not a generator of isinstance calls: a call that asks for
    # tokens gets its whole prompt echoed, and an agent's 30,000-token prompt took 0.91 ms per
    # call that way against 0.33 ms here (timeit, this machine).
    if not isinstance(value, list):
        return None
    try:
        return _TOKEN_IDS.validate_python(value, strict=True)
    except ValidationError:
        return None


def logprob_list(logprobs: Any) -> list[float] | None:
    """``[entry.logprob]`` from an OpenAI ``logprobs`` object (``{"content": [...]}``)."""
    if not isinstance(logprobs, dict) or not isinstance(logprobs.get("content"), list):
        return None
    out = []
    for entry in logprobs["content"]:
        if not isinstance(entry, dict) or not isinstance(entry.get("logprob"), (int, float)):
            return None
        out.append(float(entry["logprob"]))
    return out


def as_int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
