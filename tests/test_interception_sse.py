"""Splitting an upstream SSE stream into events: however the bytes arrive (any chunking, CRLF
or LF line ends, empty events, a trailing unfinished event), the relay gets the same blocks a
find-each-blank-line splitter over the whole stream gives."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from vfray.interception.dialects.base import SSESplitter


def _reference(stream: list[bytes]) -> tuple[list[bytes], bytes]:
    """Each event found from the start of the whole stream, its CRLFs made LFs. (It once
    normalized each chunk on its own, as the splitter did, and so shared its bug: a chunk
    ending between a CR and its LF.)"""
    buffer, blocks = b"".join(stream).replace(b"\r\n", b"\n"), []
    while (end := buffer.find(b"\n\n")) >= 0:
        blocks.append(buffer[: end + 2])
        buffer = buffer[end + 2 :]
    return blocks, buffer


_PIECE = st.sampled_from([b"data: {}", b"event: x", b"\n", b"\r\n", b"\r", b"\n\n", b": c", b"a"])


@settings(max_examples=300, deadline=None)
@given(pieces=st.lists(_PIECE, max_size=40), cuts=st.lists(st.integers(0, 200), max_size=8))
def test_any_chunking_gives_the_same_events(pieces: list[bytes], cuts: list[int]) -> None:
    data = b"".join(pieces)
    bounds = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    stream = [data[a:b] for a, b in itertools.pairwise(bounds)]
    splitter = SSESplitter()
    blocks = [block for chunk in stream for block in splitter.feed(chunk)]
    assert (blocks, splitter.rest()) == _reference(stream)


def test_a_chunk_of_many_events_is_split_in_one_pass() -> None:
    splitter = SSESplitter()
    assert splitter.feed(b"data: 1\n\ndata: 2\r\n\r\nda") == [b"data: 1\n\n", b"data: 2\n\n"]
    assert splitter.feed(b"ta: 3\n\n\n\n") == [b"data: 3\n\n", b"\n\n"]
    assert splitter.rest() == b""
