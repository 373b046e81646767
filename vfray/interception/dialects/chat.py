"""The OpenAI chat completions dialect (``POST /v1/chat/completions``), vLLM token ids included."""

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
from vfray.trace import Message, Usage

SAMPLING_KEYS = frozenset(
    {
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "max_tokens",
        "max_completion_tokens",
        "stop",
        "seed",
        "n",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "logprobs",
        "top_logprobs",
        "reasoning_effort",
    }
)


def _usage(raw: Any) -> Usage:
    if not isinstance(raw, dict):
        return Usage()
    return Usage(
        input_tokens=as_int(raw.get("prompt_tokens")),
        output_tokens=as_int(raw.get("completion_tokens")),
    )


def _prompt_ids(body: JSON, choice: JSON) -> list[int] | None:
    # vLLM puts prompt ids top-level (return_token_ids) or, in older releases, on the choice.
    return int_list(body.get("prompt_token_ids")) or int_list(choice.get("prompt_token_ids"))


def _fold(items: list[Any], start: int, offset: int) -> tuple[list[Message], list[int]]:
    # One message per item: every boundary is a restart point.
    messages = [chat_message(items[i], f"messages[{i}]") for i in range(start, len(items))]
    return messages, list(range(1, len(messages) + 1))


def _custom_call(slot: dict[str, Any]) -> JSON:
    """A streamed call of a custom tool, whole, as the chat API writes one."""
    name, text = str(slot.get("name") or ""), "".join(slot["args"])
    return {
        "id": str(slot.get("id") or ""),
        "type": "custom",
        "custom": {"name": name, "input": text},
    }


class ChatDialect(Dialect):
    name = "chat"
    token_request = {"logprobs": True, "return_token_ids": True}
    # mini-swe-agent (litellm) retries 400 and 403 ten times with backoff (~5 min) and gives
    # up at once on 401 (AuthenticationError); the OpenAI SDK retries none of them.
    final_status = 401
    path = "/chat/completions"
    sampling_keys = SAMPLING_KEYS

    def parse_request(self, body: JSON, cache: PrefixCache | None = None) -> ParsedRequest:
        messages = body.get("messages")
        require(isinstance(messages, list), "'messages' must be a list of chat messages")
        assert isinstance(messages, list)
        tools = body.get("tools")
        require(
            tools is None or (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)),
            "'tools' must be a list of objects",
        )
        stream = body.get("stream", False)
        require(isinstance(stream, bool), "'stream' must be a boolean")
        return ParsedRequest(
            messages=self.parse_items(messages, _fold, cache), tools=tools, stream=stream
        )

    def impose(self, body: JSON, model: str, sampling: Mapping[str, Any]) -> JSON:
        out = super().impose(body, model, sampling)
        if out.get("stream"):
            # Usage is what token limits count; ask for it and drop it if the client did not.
            options = out.get("stream_options")
            out["stream_options"] = {
                **(options if isinstance(options, dict) else {}),
                "include_usage": True,
            }
        return out

    def client_wants_usage(self, body: JSON) -> bool:
        options = body.get("stream_options")
        return isinstance(options, dict) and options.get("include_usage") is True

    def parse_response(self, body: JSON) -> ParsedResponse:
        choices = body.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise ValueError("chat completion without choices")
        choice = choices[0]
        return ParsedResponse(
            message=chat_message(choice.get("message"), "choices[0].message"),
            usage=_usage(body.get("usage")),
            finish_reason=choice.get("finish_reason"),
            prompt_token_ids=_prompt_ids(body, choice),
            completion_token_ids=int_list(choice.get("token_ids")),
            completion_logprobs=logprob_list(choice.get("logprobs")),
        )

    def accumulator(self, client_wants_usage: bool) -> StreamAccumulator:
        return _ChatStream(client_wants_usage)

    def error_body(self, status: int, message: str) -> JSON:
        return openai_error(status, message)


class _ChatStream(StreamAccumulator):
    def __init__(self, client_wants_usage: bool) -> None:
        self.client_wants_usage = client_wants_usage
        self.role = "assistant"
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.usage = Usage()
        self.finish_reason: str | None = None
        self.prompt_ids: list[int] | None = None
        self.token_ids: list[int] | None = None
        self.logprobs: list[float] | None = None
        self.error: str | None = None
        self.saw_choice = False
        self._last_call: int | None = None

    def feed(self, event: SSEEvent) -> Action:
        if event.data.strip() == "[DONE]":
            return Action.HOLD
        chunk = event.json()
        if chunk is None:
            return Action.RELAY
        if "error" in chunk:
            self.error = str(chunk["error"])[:2000]
        if isinstance(chunk.get("usage"), dict):
            self.usage = _usage(chunk["usage"])
        choices = chunk.get("choices")
        if not isinstance(choices, list) or not choices:
            usage_only = "usage" in chunk and "error" not in chunk
            return Action.DROP if usage_only and not self.client_wants_usage else Action.RELAY
        choice = choices[0]
        # With n > 1 each chunk carries one choice, by its index: the reply recorded is choice
        # 0, as a non-streamed call's (the others were run into it, text and token ids alike).
        if isinstance(choice, dict) and choice.get("index", 0) in (0, None):
            self._choice(chunk, choice)
        return Action.RELAY

    def _choice(self, chunk: JSON, choice: JSON) -> None:
        self.saw_choice = True
        if self.prompt_ids is None:
            self.prompt_ids = _prompt_ids(chunk, choice)
        # Extended in place: a long completion streams one token per event.
        ids = int_list(choice.get("token_ids"))
        if ids is not None:
            if self.token_ids is None:
                self.token_ids = []
            self.token_ids += ids
        lps = logprob_list(choice.get("logprobs"))
        if lps is not None:
            if self.logprobs is None:
                self.logprobs = []
            self.logprobs += lps
        if choice.get("finish_reason") is not None:
            self.finish_reason = str(choice["finish_reason"])
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return
        if isinstance(delta.get("role"), str):
            self.role = delta["role"]
        if isinstance(delta.get("content"), str):
            self.content.append(delta["content"])
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if isinstance(reasoning, str):
            self.reasoning.append(reasoning)
        for part in delta.get("tool_calls") or []:
            if not isinstance(part, dict):
                continue
            slot = self.calls.setdefault(self._call_index(part), {"args": []})
            if part.get("id"):
                slot["id"] = part["id"]
            fn = part.get("function")
            if not isinstance(fn, dict) and isinstance(part.get("custom"), dict):
                fn = part["custom"]  # a custom tool's call: free text streamed as "input"
                slot["custom"] = True
            if isinstance(fn, dict):
                if fn.get("name"):
                    slot["name"] = fn["name"]
                text = fn.get("input") if slot.get("custom") else fn.get("arguments")
                if isinstance(text, str):
                    slot["args"].append(text)

    def _call_index(self, part: JSON) -> int:
        """The slot of a streamed tool-call part: its ``index``. Gemini's OpenAI-compatible
        stream (and some proxies) sends none: then a part with an id of its own opens the next
        call and one without continues the last (they were all merged into call 0)."""
        index = part.get("index")
        if isinstance(index, int) and not isinstance(index, bool):
            self._last_call = index
            return index
        own_id = part.get("id")
        last = self._last_call
        if last is None or (own_id and own_id != self.calls.get(last, {}).get("id")):
            last = max(self.calls, default=-1) + 1
        self._last_call = last
        return last

    def result(self) -> ParsedResponse:
        message = None
        if self.saw_choice:
            raw: JSON = {"role": self.role, "content": "".join(self.content) or None}
            if self.reasoning:
                raw["reasoning_content"] = "".join(self.reasoning)
            if self.calls:
                raw["tool_calls"] = [
                    _custom_call(c)
                    if c.get("custom")
                    else tool_call(c.get("id"), c.get("name"), "".join(c["args"]))
                    for _, c in sorted(self.calls.items())
                ]
            message = chat_message(raw, "reply")
        return ParsedResponse(
            message=message,
            usage=self.usage,
            finish_reason=self.finish_reason,
            prompt_token_ids=self.prompt_ids,
            completion_token_ids=self.token_ids,
            completion_logprobs=self.logprobs,
            error=self.error,
        )
