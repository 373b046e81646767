"""A request body parsed once with the text of each top-level member kept
(:func:`read_object`), and the body forwarded upstream written from it
(:meth:`ClientJson.forward`): each value the interception left as the client sent it goes out as
the client's own text, and only the values it set (the model, the sampling, the token fields)
are serialised.

A request's history is most of its bytes, and writing it out again cost more than parsing it:
``json.dumps`` of a Codex request (44 KB: instructions, tool schemas, input items) took ~150 µs
against ~105 µs for ``json.loads``, and a 124 KB chat history ~260 µs against ~200 µs, on every
call. A value's text parses to exactly the value the interception holds (that text is what it
was parsed from), so the upstream reads the same request either way; one difference is left: a
key written twice inside a value goes upstream twice, as the client wrote it (the trace, like
``json.loads``, keeps the last).

The walk uses the ``json`` module's own scanner for every key and value, so what it accepts and
the values it makes are those of ``json.loads``; anything it does not read as a plain object
(an error, a nesting too deep) returns None and the caller parses the body the usual way, whose
error message the client then gets.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

# The C scanner json.loads itself uses, and its string reader (neither is in typeshed).
_SCAN: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]
_STRING: Callable[[str, int, bool], tuple[str, int]] = json.decoder.scanstring  # type: ignore[attr-defined]
WORTH_FROM_BYTES = 4096
"""Bodies shorter than this are parsed and written out the plain way: below ~4 KB the walk's
Python per member costs more than writing the body again saves (``timeit``, chat bodies: 9-13
µs the plain way against 18-21 µs for the walk at 0.3-1 KB; at 8 KB the walk wins, 26 against
47 µs)."""
_WHITESPACE = re.compile(r"[ \t\n\r]*")  # json.decoder's own definition
_BLANKS = " \t\n\r"


@dataclass(frozen=True, slots=True)
class ClientJson:
    """The body's bytes and text and, per top-level key, the span of the value the parse kept
    (the last one written, as ``json.loads`` keeps it), with the value made from it."""

    raw: bytes
    text: str
    members: dict[str, tuple[Any, int, int]]

    def forward(self, body: Mapping[str, Any]) -> bytes:
        """``body`` as JSON: a value that is the very object parsed from the client's text is
        that text; any other value (set or replaced by the interception) is ``json.dumps``'d.
        Only the top level is compared: callers hand this only bodies whose nested values no
        one changed in place (no stop hook was handed the request; token-in only sets
        top-level keys)."""
        members, raw, text = self.members, self.raw, self.text
        # An ASCII body's characters are its bytes: its spans are cut from the bytes as they
        # came. Otherwise each kept span is encoded on its own (a slice with no wide character
        # is ASCII again, and encodes as a copy): encoding a 44 KB text with one wide
        # character took ~55 us, a third of what this saves.
        same_offsets = len(raw) == len(text)
        parts = []
        for key, value in body.items():
            kept = members.get(key)
            if kept is None or kept[0] is not value:
                out = json.dumps(value).encode()
            elif same_offsets:
                out = raw[kept[1] : kept[2]]
            else:
                # surrogatepass: the text came from the client's bytes so (json.loads's decode).
                out = text[kept[1] : kept[2]].encode("utf-8", "surrogatepass")
            parts.append(json.dumps(key).encode() + b": " + out)
        return b"{" + b", ".join(parts) + b"}"


def read_object(raw: bytes) -> tuple[dict[str, Any], ClientJson] | None:
    """The JSON object ``raw`` holds, as ``json.loads(raw)`` makes it, and its members' text;
    None where ``raw`` is not one (or nests too deeply for the scanner)."""
    try:
        text = raw.decode(json.detect_encoding(raw), "surrogatepass")
        return _walk(raw, text)
    except (ValueError, StopIteration, RecursionError):
        return None


def _skip(text: str, at: int) -> int:
    """The index past the whitespace at ``at``."""
    if text[at : at + 1] not in _BLANKS:  # most clients write none, or one space
        return at
    found = _WHITESPACE.match(text, at)  # the pattern matches the empty string too
    return found.end() if found is not None else at


def _walk(raw: bytes, text: str) -> tuple[dict[str, Any], ClientJson] | None:
    ws = _skip
    at = ws(text, 0)
    if text[at : at + 1] != "{":
        return None
    body: dict[str, Any] = {}
    members: dict[str, tuple[Any, int, int]] = {}
    at = ws(text, at + 1)
    if text[at : at + 1] == "}":
        at += 1
    else:
        while True:
            if text[at : at + 1] != '"':
                return None
            key, at = _STRING(text, at + 1, True)
            at = ws(text, at)
            if text[at : at + 1] != ":":
                return None
            start = ws(text, at + 1)
            value, at = _SCAN(text, start)
            body[key] = value
            members[key] = (value, start, at)
            at = ws(text, at)
            mark = text[at : at + 1]
            at = ws(text, at + 1)
            if mark == "}":
                break
            if mark != ",":
                return None
    if ws(text, at) != len(text):
        return None
    return body, ClientJson(raw, text, members)
