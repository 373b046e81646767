"""A bridge's text without rendering the chat template: the text the template puts around each
new message's content, found once per shape of the new messages, then joined with the content.

Rendering the bridge in Jinja's sandbox is most of what a new follow-up costs token-in (tool
results and user turns an agent sends are new text on nearly every turn, so the bridge cache
rarely serves them). For a shape (the new messages' roles, names and which carry a tool call
id, with the tools and the stop token) the template is rendered with sentinel contents, twice
with different sentinels and tool call ids, and the text after the stop token is split around
them. The shape is served from those pieces only when both renders give the same pieces (the
template renders neither the content's characters differently, escaping or dropping them, nor
the ids) and, once, when they give the real render of the first real message of that shape.

A template may still look at what the content says (Qwen's tests whether a user turn starts
with ``<tool_response>``), which no sentinel shows: content with a ``<``, with whitespace at
either end (templates trim) or empty, and any message with other fields, is rendered for real.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vfray.endpoints.chat_template import ChatTemplate

_MAX_SHAPES = 256
_FIELDS = frozenset({"role", "content", "name", "tool_call_id"})
_ROLES = frozenset({"tool", "user"})
_MARKS = ("\ue000", "\ue001")
"""Private-use characters that open and close a sentinel; content holding them is rendered."""


def dummy_assistant(tail: list[dict[str, Any]]) -> dict[str, Any]:
    """The assistant turn a bridge is rendered after."""
    # A tool message must follow an assistant turn that called it (templates check): the dummy
    # calls the tools the tail answers. reasoning_content="" keeps templates that render
    # reasoning by position (GLM) from flipping between the two renders.
    ids = []
    for message in tail:
        if message.get("role") != "tool":
            break
        if message.get("tool_call_id"):
            ids.append(str(message["tool_call_id"]))
    if ids:
        calls = [
            {"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}} for i in ids
        ]
        return {"role": "assistant", "reasoning_content": "", "content": None, "tool_calls": calls}
    return {"role": "assistant", "reasoning_content": "", "content": "x"}


def _sentinel(variant: str, index: int) -> str:
    # Quotes, a backslash, control characters, markup and non-ASCII: a template that escapes or
    # re-encodes content (tojson, HTML escaping) does not give the sentinel back as written.
    return f"{_MARKS[0]}{variant}{index} \"'\\\n\t&<>\u00e9{_MARKS[1]}"


def _plain(content: Any) -> bool:
    return (
        isinstance(content, str)
        and content != ""
        and "<" not in content
        and not content[0].isspace()
        and not content[-1].isspace()
        and _MARKS[0] not in content
        and _MARKS[1] not in content
    )


class BridgeWrappers:
    """The template's text around the new messages' contents, per shape (one per TokenIn)."""

    def __init__(self, template: ChatTemplate) -> None:
        self._template = template
        self._shapes: dict[tuple[Any, ...], tuple[list[str], bool] | None] = {}
        self.served = 0
        """Bridges whose text was joined from the pieces (not rendered)."""

    def text(
        self,
        tail: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        tools_key: str,
        stop_text: str,
        real: Callable[[], str],
    ) -> str | None:
        """The bridge's text (from the stop token on), or None where it must be rendered.
        ``real`` renders it, called once per shape to check the pieces against."""
        shape: list[tuple[Any, ...]] = []
        for message in tail:
            if (
                not message.keys() <= _FIELDS
                or message.get("role") not in _ROLES
                or not _plain(message.get("content"))
            ):
                return None
            shape.append((message["role"], message.get("name"), bool(message.get("tool_call_id"))))
        key = (tools_key, stop_text, *shape)
        if key in self._shapes:
            entry = self._shapes[key]
        else:
            pieces = self._pieces(tail, tools, stop_text)
            entry = None if pieces is None else (pieces, False)
            if len(self._shapes) >= _MAX_SHAPES:
                self._shapes.pop(next(iter(self._shapes)))  # the oldest
            self._shapes[key] = entry
        if entry is None:
            return None
        pieces, checked = entry
        parts = [pieces[0]]
        for message, after in zip(tail, pieces[1:], strict=True):
            parts += (message["content"], after)
        text = "".join(parts)
        if not checked:
            if text != real():
                self._shapes[key] = None
                return None
            self._shapes[key] = (pieces, True)
        self.served += 1
        return text

    def _pieces(
        self, tail: list[dict[str, Any]], tools: list[dict[str, Any]] | None, stop_text: str
    ) -> list[str] | None:
        """The text before, between and after the contents; None where the two sentinel
        renders disagree or the template fails on them."""
        found = []
        for variant in "ab":
            fake = []
            for i, message in enumerate(tail):
                fields = {**message, "content": _sentinel(variant, i)}
                if fields.get("tool_call_id"):
                    fields["tool_call_id"] = f"call_{variant}{i}"
                fake.append(fields)
            dummy = dummy_assistant(fake)
            try:
                base = self._template.render([dummy], tools=tools, add_generation_prompt=False)
                full = self._template.render([dummy, *fake], tools=tools)
            except Exception:
                return None  # rendered for real, which says why
            at = base.rfind(stop_text)
            if at < 0 or not full.startswith(base):
                return None
            rest = full[at:]
            pieces = []
            for i in range(len(fake)):
                sentinel = _sentinel(variant, i)
                if rest.count(sentinel) != 1:
                    return None
                before, _, rest = rest.partition(sentinel)
                pieces.append(before)
            pieces.append(rest)
            found.append(pieces)
        return found[0] if found[0] == found[1] else None
