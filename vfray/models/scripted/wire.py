"""The scripted model's three wire dialects, reading side: parse OpenAI chat, OpenAI Responses
and Anthropic Messages requests into a :class:`Conversation` (rendering is in ``render.py``).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from vfray.models.scripted.agent import find_shell
from vfray.models.scripted.conversation import NAMESPACE_SEP, Conversation

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


def _images(content: Any) -> list[str]:
    """The image URLs among a content's parts (an Anthropic base64 source as a data URL)."""
    urls: list[str] = []
    for part in content if isinstance(content, list) else []:
        kind = part.get("type") if isinstance(part, dict) else None
        url = None
        if kind == "image_url":
            source = part.get("image_url")
            url = source.get("url") if isinstance(source, dict) else source
        elif kind == "input_image":
            url = part.get("image_url")
        elif kind == "image" and isinstance(part.get("source"), dict):
            source = part["source"]
            url = source.get("url")
            if source.get("type") == "base64":
                url = f"data:{source.get('media_type')};base64,{source.get('data')}"
        if isinstance(url, str):
            urls.append(url)
    return urls


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
        if tool.get("type") == "namespace" and isinstance(tool.get("tools"), list):
            # A Responses namespace (Codex groups an MCP server's tools so): its tools as
            # NAMESPACE::TOOL, which a reply's call splits back (policies.NAMESPACE_SEP).
            for inner in tool["tools"]:
                if isinstance(inner, dict) and isinstance(inner.get("name"), str):
                    names.add(f"{name}{NAMESPACE_SEP}{inner['name']}")
    return frozenset(names)


def _has_fence(text: str) -> bool:
    return "```" in text


def _common(
    body: Json,
    texts: list[str],
    last_user: str,
    tool_output: str | None,
    max_tokens: int | None,
    *,
    user_texts: list[str],
    user_actions: list[int],
    actions: int,
    system: str = "",
    assistant_texts: tuple[str, ...] = (),
    images: list[str] | None = None,
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
        user_texts=tuple(user_texts),
        user_actions=tuple(user_actions),
        shell=find_shell(_objects(body, "tools", required=False)),
        actions_taken=actions,
        system=system,
        assistant_texts=assistant_texts,
        images=tuple(images or ()),
    )
    return Request(conv, model, bool(stream), bool(options.get("include_usage")))


def parse_chat(body: Json) -> Request:
    messages = _objects(body, "messages", required=True)
    n = _typed(body, "n", int, "an integer")
    if n not in (None, 1):
        raise BadRequest("the scripted model supports only n=1", "n")
    texts, last_user, tool_output = [], "", None
    user_texts: list[str] = []
    user_actions: list[int] = []
    actions = 0
    system: list[str] = []
    assistant_texts: list[str] = []
    images: list[str] = []
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
            images = _images(message.get("content"))
            user_texts.append(text)
            user_actions.append(actions)
        if role == "assistant" and (message.get("tool_calls") or _has_fence(text)):
            actions += 1
        if role in ("system", "developer"):
            system.append(text)
        elif role == "assistant":
            assistant_texts.append(text)
        tool_output = text if role in ("tool", "function") else None
    return _common(
        body,
        texts,
        last_user,
        tool_output,
        _max_tokens(body, "max_completion_tokens", "max_tokens"),
        user_texts=user_texts,
        user_actions=user_actions,
        actions=actions,
        system="\n".join(system),
        assistant_texts=tuple(assistant_texts),
        images=images,
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
    user_texts: list[str] = []
    images: list[str] = []
    user_actions: list[int] = []
    actions = 0
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
                images = _images(item.get("content"))
                user_texts.append(text)
                user_actions.append(actions)
            elif item["role"] == "assistant" and _has_fence(text):
                actions += 1
        elif kind == "function_call_output":
            text = tool_output = _text(item.get("output"), f"input[{i}].output")
        elif kind == "function_call":
            text = str(item.get("arguments", ""))
            actions += 1
        else:
            continue  # reasoning and other items carry nothing a policy reads
        texts.append(text)
    return _common(
        body,
        texts,
        last_user,
        tool_output,
        _max_tokens(body, "max_output_tokens"),
        user_texts=user_texts,
        user_actions=user_actions,
        actions=actions,
        images=images,
    )


def parse_anthropic(body: Json) -> Request:
    messages = _objects(body, "messages", required=True)
    max_tokens = _max_tokens(body, "max_tokens")
    if max_tokens is None:
        raise BadRequest("max_tokens: Field required", "max_tokens")
    texts = [_text(body.get("system"), "system")]
    last_user, tool_output = "", None
    user_texts: list[str] = []
    images: list[str] = []
    user_actions: list[int] = []
    actions = 0
    for i, message in enumerate(messages):
        role = message.get("role")
        # Claude Code puts its environment description in a role "system" entry here.
        if role not in ("user", "assistant", "system"):
            raise BadRequest(
                f"messages.{i}.role must be 'user' or 'assistant'", f"messages.{i}.role"
            )
        content = message.get("content")
        text = _text(content, f"messages.{i}.content")
        texts.append(text)
        if role == "system":
            continue
        if role == "assistant":
            uses = isinstance(content, list) and any(
                isinstance(b, dict) and b.get("type") == "tool_use" for b in content
            )
            actions += 1 if uses or _has_fence(text) else 0
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
            images = _images(content)
            user_texts.append(text)
            user_actions.append(actions)
    return _common(
        body,
        texts,
        last_user,
        tool_output,
        max_tokens,
        user_texts=user_texts,
        user_actions=user_actions,
        actions=actions,
        images=images,
    )
