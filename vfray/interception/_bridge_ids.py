"""A joined bridge's token ids with its constant ends encoded once: per turn only the text from
the last added token before the first content to the first added token after the last one.

``tokenizers`` first finds the added tokens in the text (leftmost-longest), then normalizes,
pre-tokenizes and encodes each stretch between them on its own, so the ids of a text are those
of its stretches joined at added tokens the tokenizer matched. A bridge joined from the
template's text around its contents (:mod:`~vfray.interception._bridge_wrappers`) starts and
ends with text that is the same for every content of its shape (``<|im_end|>\\n<|im_start|>`` and
``<|im_end|>\\n<|im_start|>assistant\\n`` for ChatML): cut at a clean added token (matched as
written, no whitespace stripped, not normalized, not single-word) on each side, those ends are
encoded once, and each turn encodes the middle, from the left cut's token to the right cut's
token, so both are there as the whole text has them (a position-aware pre-tokenizer such as
SentencePiece's first-word space sees the middle away from the text's start, and a single-word
token at either edge sees its neighbour).

The cut holds while the tokenizer matches the cut tokens where they stand, which only an added
token spanning from a constant end into a content could change. The added tokens that could
(their text overlapping a cut token and reaching past the constant text) are listed per shape,
with the part a content must start or end with for them to match; a content that could complete
one is encoded whole (usually the lists are empty). The first real bridge of a shape is also
encoded whole and must give the same ids, or the shape is always encoded whole. A tokenizer that
truncates or pads, or that does not split at special tokens, is not cut.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Ends:
    """A shape's constant ends, encoded once, and how a turn's middle is cut."""

    head: list[int]
    """Ids of the first piece up to and including the left cut token."""
    around: tuple[str, ...]
    """The middle's text around the contents: the first piece from the left cut token on, the
    pieces between the contents, the last piece up to the end of the right cut token."""
    tail: list[int]
    """Ids of the last piece from the right cut token on (empty when it has none)."""
    starts: tuple[str, ...]
    """A first content starting with one of these (or the start of one) is encoded whole."""
    finishes: tuple[str, ...]
    """A last content ending with one of these (or the end of one) is encoded whole."""


def plan(tokenizer: Any, pieces: Sequence[str]) -> Ends | None:
    """The ends of a shape whose text is ``pieces`` around its contents; None where the
    tokenizer cannot be cut (then every bridge of the shape is encoded whole)."""
    if (
        tokenizer.truncation is not None
        or tokenizer.padding is not None
        or getattr(tokenizer, "encode_special_tokens", False)
    ):
        return None
    added = tokenizer.get_added_tokens_decoder().values()
    clean = {
        i: t.content
        for i, t in tokenizer.get_added_tokens_decoder().items()
        if not (t.normalized or t.lstrip or t.rstrip or t.single_word) and t.content
    }
    # Normalized added tokens are matched later, inside the stretches between the others: they
    # never span a cut token. Every other one (stripping or single-word ones too) might.
    matched_first = [t.content for t in added if not t.normalized and len(t.content) > 1]
    first, last = pieces[0], pieces[-1]
    left = _cut(tokenizer, first, clean, from_end=True)
    if left is None:
        return None
    right = _cut(tokenizer, last, clean, from_end=False)
    rest = len(first) - left[1]  # the text between the left cut token and the first content
    starts = {
        a[j:] for a in matched_first for j in range(rest + 1, len(a)) if first.endswith(a[:j])
    }
    finishes: set[str] = set()
    if right is not None:
        finishes = {
            a[:j]
            for a in matched_first
            for j in range(1, len(a))
            if len(a) - j > right[0] and last.startswith(a[j:])
        }
    head = tokenizer.encode(first[: left[1]], add_special_tokens=False).ids
    tail = tokenizer.encode(last[right[0] :], add_special_tokens=False).ids if right else []
    return Ends(
        head=list(head),
        around=(first[left[0] :], *pieces[1:-1], last[: right[1]] if right else last),
        tail=list(tail),
        starts=tuple(starts),
        finishes=tuple(finishes),
    )


def _cut(
    tokenizer: Any, text: str, clean: dict[int, str], *, from_end: bool
) -> tuple[int, int] | None:
    """Where the last (or first) clean added token the tokenizer finds in ``text`` stands."""
    encoding = tokenizer.encode(text, add_special_tokens=False)
    spans = list(zip(encoding.ids, encoding.offsets, strict=True))
    for token, (start, end) in reversed(spans) if from_end else spans:
        if token in clean and text[start:end] == clean[token]:
            return start, end
    return None


def joined(
    ends: Ends, contents: Sequence[str], encode: Callable[[str], list[int]]
) -> list[int] | None:
    """The ids of the shape's pieces joined around ``contents``, encoding only the middle; None
    where a content could complete an added token across a cut (then encode the whole text)."""
    first, last = contents[0], contents[-1]
    if ends.starts and any(first.startswith(s) or s.startswith(first) for s in ends.starts):
        return None
    if ends.finishes and any(last.endswith(f) or f.endswith(last) for f in ends.finishes):
        return None
    around = ends.around
    parts = [around[0]]
    for content, after in zip(contents, around[1:], strict=True):
        parts += (content, after)
    middle = encode("".join(parts))
    # The middle starts with the left cut token and ends with the right one, as in the whole.
    if not middle or middle[0] != ends.head[-1]:
        return None
    if ends.tail:
        if middle[-1] != ends.tail[0]:
            return None
        return [*ends.head, *middle[1:-1], *ends.tail]
    return [*ends.head, *middle[1:]]
