"""A bridge's ids without rendering the chat template: the text the template puts around each
new message's content, found once per shape of the new messages, then joined with the content
and encoded (only its middle, where the tokenizer allows: :mod:`._bridge_ids`).

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

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vfray.endpoints.chat_template import ChatTemplate
from vfray.interception._bridge_ids import Ends, joined, plan

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


def answers_calls(tail: list[dict[str, Any]]) -> bool:
    """Whether :func:`dummy_assistant` calls tools for ``tail`` (it leads with tool results
    that name the calls they answer)."""
    for message in tail:
        if message.get("role") != "tool":
            return False
        if message.get("tool_call_id"):
            return True
    return False


def tail_key_of(tail: list[dict[str, Any]]) -> tuple[Any, int]:
    """The bridge cache's exact key for the new messages, and their size (characters). Messages
    of string fields (the usual user turn or tool result) are their items in order, with no
    JSON written: the same items in the same order render the same. Others are their JSON."""
    items = []
    size = 0
    for message in tail:
        values = message.values()
        if not all(type(v) is str for v in values):
            text = json.dumps(tail)
            return text, len(text)
        size += sum(map(len, values))
        items.append(tuple(message.items()))
    return tuple(items), size


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


@dataclass
class _Shape:
    pieces: list[str]
    """The text before, between and after the contents (from the stop token on)."""
    ends: Ends | None
    """Its constant ends' ids, where the tokenizer can be cut (see :mod:`._bridge_ids`)."""
    checked: bool = False
    """The joined text was the real render once (and its ids the whole text's)."""
    ends_checked: bool = False
    """The ids joined at the ends were those of the whole text once."""


class BridgeWrappers:
    """The template's text around the new messages' contents, per shape (one per TokenIn)."""

    def __init__(self, template: ChatTemplate) -> None:
        self._template = template
        self._shapes: dict[tuple[Any, ...], _Shape | None] = {}
        self.served = 0
        """Bridges whose text was joined from the pieces (not rendered)."""
        self.cut = 0
        """Of those, the bridges whose ids were joined to the constant ends' (only the middle
        encoded)."""

    def ids(
        self,
        tail: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        tools_key: str,
        stop_text: str,
        real: Callable[[], str],
    ) -> list[int] | None:
        """The bridge's token ids (from the stop token on), or None where it must be rendered.
        ``real`` renders its text, called once per shape to check the pieces against."""
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
            entry = None if pieces is None else _Shape(pieces, self._plan(pieces))
            if len(self._shapes) >= _MAX_SHAPES:
                self._shapes.pop(next(iter(self._shapes)))  # the oldest
            self._shapes[key] = entry
        if entry is None:
            return None
        contents = [message["content"] for message in tail]
        encode = self._template.encode
        if entry.checked and entry.ends is not None:
            ids = joined(entry.ends, contents, encode)
            if ids is not None and entry.ends_checked:
                self.served += 1
                self.cut += 1
                return ids
        else:
            ids = None
        parts = [entry.pieces[0]]
        for content, after in zip(contents, entry.pieces[1:], strict=True):
            parts += (content, after)
        text = "".join(parts)
        if not entry.checked:
            if text != real():
                self._shapes[key] = None
                return None
            entry.checked = True
        whole = encode(text)
        if ids is not None:  # the first bridge joined at the ends: checked against the whole
            entry.ends_checked = ids == whole
            if not entry.ends_checked:
                entry.ends = None
        self.served += 1
        return whole

    def _plan(self, pieces: list[str]) -> Ends | None:
        try:
            return plan(self._template.tokenizer, pieces)
        except Exception:  # a tokenizer unlike HF's: its bridges are encoded whole, as before
            return None

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
