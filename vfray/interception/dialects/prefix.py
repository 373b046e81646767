"""Per-session reuse of parsed request history, so a turn costs its new tail, not its whole history.

Agents resend their whole conversation on every call; parsing each message into a
:class:`~vfray.trace.Message` and content-hashing it again made a rollout's recording cost grow
with the square of its turns. A :class:`PrefixCache` remembers the raw items of the session's
last few requests and what they parsed to; a request that repeats one of them as a prefix reuses
those parsed messages (ids already cached on them) and parses only the rest.
"""

from __future__ import annotations

import marshal
from collections.abc import Callable
from dataclasses import dataclass
from itertools import repeat
from typing import Any

from vfray.trace import Message

Fold = Callable[[list[Any], int, int], tuple[list[Message], list[int]]]
"""``fold(items, start, offset)``: parse ``items[start:]`` from a clean state.

``offset`` is how many messages the reused prefix holds (only error messages use it). Returns the
messages and, for each boundary ``i`` in ``start + 1 .. len(items)``, how many of those messages
``items[start:i]`` fix for good if parsing can restart at item ``i``, or -1 where it cannot (a
Responses assistant message that later items may still extend).
"""

_LINEAGES = 4
"""Requests remembered per session: a main agent and a few sub-agents interleaving their calls
each keep their own history instead of evicting each other's on every call."""


@dataclass
class _Parsed:
    keys: list[bytes]
    """Each raw item's equality key (see :func:`_keys`)."""
    messages: list[Message]
    marks: list[int]
    """``len(keys) + 1`` entries: ``marks[i]`` is how many messages ``items[:i]`` fix when
    parsing can restart at item ``i``, else -1 (``marks[0]`` is 0)."""


class PrefixCache:
    """What one session's recent requests parsed to, for one dialect at a time."""

    def __init__(self, lineages: int = _LINEAGES) -> None:
        self.lineages = lineages
        self.dialect: str | None = None
        self._recent: list[_Parsed] = []  # most recently used first
        self._system: tuple[object, Message] | None = None

    def system(self, content: Any) -> Message:
        """``Message(role="system", content=content)``: the same object while the session's
        system prompt (Responses ``instructions``, Anthropic ``system``) stays the same, since
        an agent sends it with every call and its id is a hash of all of it (~12 KB: Codex)."""
        key = content if isinstance(content, str) else _keys([content])
        if key is None:
            return Message(role="system", content=content)
        if self._system is None or self._system[0] != key:
            self._system = (key, Message(role="system", content=content))
        return self._system[1]

    def parse(self, dialect: str, items: list[Any], fold: Fold) -> list[Message]:
        """The messages ``fold(items, 0, 0)`` gives, reusing a remembered request's prefix."""
        if dialect != self.dialect:
            # The same raw item means different messages in another dialect.
            self.dialect = dialect
            self._recent.clear()
        keys = _keys(items)
        if keys is None:
            return fold(items, 0, 0)[0]
        best: _Parsed | None = None
        common = start = 0
        for entry in self._recent:
            n, s = _restart_point(entry, keys)
            if s > start:
                best, common, start = entry, n, s
        if best is None:
            messages, marks = fold(items, 0, 0)
            parsed = _Parsed(keys, messages, [0, *marks])
        else:
            offset = best.marks[start]
            tail, marks = fold(items, start, offset)
            parsed = _Parsed(
                # The prefix keeps the remembered keys and messages, so lineages that share a
                # prefix share its memory.
                best.keys[:start] + keys[start:],
                best.messages[:offset] + tail,
                best.marks[: start + 1] + [m + offset if m >= 0 else -1 for m in marks],
            )
            if common == len(best.keys):
                # The request extends (or repeats) that one: it takes its place. One that
                # diverged (a rewritten history, a sibling sub-agent) is kept alongside.
                self._recent.remove(best)
        self._recent.insert(0, parsed)
        del self._recent[self.lineages :]
        return list(parsed.messages)


def _keys(items: list[Any]) -> list[bytes] | None:
    """Each item's equality key: its ``marshal`` (format 2) bytes, or None if unkeyable.

    Not ``==``: JSON values that Python calls equal can still parse to different messages
    (``1``, ``1.0`` and ``true``; ``0.0`` and ``-0.0``; the same keys in another order). The
    marshal of a decoded JSON value tags every type, writes floats' bits and keeps key order, so
    equal keys mean the same parse; format 2 writes no back-references, so the bytes depend on the
    value alone, not on which objects it shares. It runs in C at about the cost of the JSON
    decoding (``repr``, the other exact key that runs in C, measured 1.5-2x slower).
    """
    try:
        return list(map(marshal.dumps, items, repeat(2)))
    except (ValueError, RecursionError):  # nested deeper than marshal goes: parse it all
        return None


def _restart_point(entry: _Parsed, keys: list[bytes]) -> tuple[int, int]:
    """How many leading items match ``entry``, and the last boundary up to there to restart at."""
    old = entry.keys
    n = min(len(old), len(keys))
    if old[:n] != keys[:n]:  # the common case, a request extending this one, stays in C
        n = next(i for i, (a, b) in enumerate(zip(old, keys, strict=False)) if a != b)
    s = n
    while entry.marks[s] < 0:
        s -= 1
    return n, s
