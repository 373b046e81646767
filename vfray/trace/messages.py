"""The chat messages a trace stores: :class:`Message` (OpenAI chat shape, content-addressed so
equal messages are stored once in ``Trace.graph``), :class:`Branch` (one linear context of message
ids), and the canonical JSON every vfray hash is taken over."""

from __future__ import annotations

import functools
import hashlib
import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no whitespace: the form every vfray hash is taken over."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


class Message(BaseModel):
    """One chat message in OpenAI chat shape; unknown provider fields are kept, not dropped."""

    model_config = ConfigDict(frozen=True, extra="allow")

    role: str
    content: Any = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None

    @functools.cached_property
    def id(self) -> str:
        """Content address: equal messages share one id, so the graph stores them once.
        Cached: it is asked for on every recorded call (the hot path of the proxy)."""
        payload = canonical_json(self.model_dump(exclude_none=True))
        return hashlib.sha256(payload.encode()).hexdigest()[:20]

    @property
    def text(self) -> str:
        """The content flattened to text (list-of-parts content joins its text parts)."""
        return content_text(self.content)


def content_text(content: Any) -> str:
    """Flatten OpenAI/Anthropic style content (str or list of parts) to plain text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict):
                text = part.get("text")
                if isinstance(text, str):
                    parts.append(text)
        return "".join(parts)
    return str(content)


UserContent = str | list[dict[str, Any]]
"""What one user turn says: text, or chat content parts (``{"type": "text", "text": ...}``,
``{"type": "image_url", "image_url": {"url": ...}}``), as a user message's ``content``."""


def is_user_content(value: object) -> bool:
    """Whether ``value`` is :data:`UserContent`: a str, or a list of parts each with a type."""
    if isinstance(value, str):
        return True
    return isinstance(value, list) and all(
        isinstance(p, dict) and isinstance(p.get("type"), str) for p in value
    )


class Branch(BaseModel):
    """One linear, append-only context: message ids in order, and the calls that grew it."""

    id: int
    message_ids: list[str] = Field(default_factory=list)
    call_indices: list[int] = Field(default_factory=list)
