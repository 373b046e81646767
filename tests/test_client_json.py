"""The request body read with its members' text kept (vfray.interception._client_json): it must
make exactly what ``json.loads`` makes, refuse nothing ``json.loads`` takes as an object, and
forward a body that parses to what ``json.dumps`` of it would, for any top-level change."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from vfray.interception._client_json import read_object


def _same(a: Any, b: Any) -> bool:
    # repr tells 1 from 1.0 and True, and keeps key order: == would not.
    return type(a) is type(b) and repr(a) == repr(b)


EDGES = [
    b"{}",
    b" {\n} \t",
    b'{"a":1,"a":2.0}',  # the last value is kept, at the first key's place
    b'{"a": 1, "b": 2, "a": 3}',
    b'{"a":[1,{"b":null}],"c":"\\u00e9\\ud83d\\ude00","d":1e400,"e":NaN,"f":-Infinity}',
    b'{"\\u0061":1, "a":2}',  # one key, spelled two ways
    b'{"a":123456789012345678901234567890, "b":1.0E+2}',
    b'\xef\xbb\xbf{"a":1}',  # a UTF-8 byte-order mark
    '{"a":"é"}'.encode("utf-16"),
    '{"a":"é","b":[1,"中"],"c":"plain"}'.encode(),
    b'{"a":"\xed\xa0\x80"}',  # a surrogate written as UTF-8: json.loads takes it
    b'{"a":1 , "b" :\t2 }',
    # not objects, or not JSON: None here, and json.loads's own error for the client
    b"[1]",
    b'"x"',
    b"",
    b"{",
    b"{,}",
    b'{"a":1,}',
    b'{"a" 1}',
    b'{"a":1 "b":2}',
    b'{"a":1} x',
    b'{"a":1}{"b":2}',
    b'{"a":"\x01"}',
    b'{"a":tru}',
    b"\xff",
    b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
]


def _random_bodies(count: int) -> list[bytes]:
    rng = random.Random(7)
    leaves = [1, -2, 3.5, 1e20, True, False, None, "s", "été", "\U0001f600", 'a"b\\c\n', 10**30]

    def value(depth: int) -> Any:
        roll = rng.random()
        if depth > 3 or roll < 0.3:
            return rng.choice(leaves)
        if roll < 0.6:
            return [value(depth + 1) for _ in range(rng.randint(0, 4))]
        return {rng.choice("abcdeé"): value(depth + 1) for _ in range(rng.randint(0, 4))}

    bodies = []
    keys = ["model", "messages", "x", "é", "tools", "stream"]
    for _ in range(count):
        body = {k: value(0) for k in rng.sample(keys, rng.randint(0, len(keys)))}
        text = json.dumps(
            body,
            ensure_ascii=rng.random() < 0.5,
            indent=rng.choice([None, 1, "\t"]),
            separators=rng.choice([None, (",", ":")]),
        )
        bodies += [text.encode(), text[: rng.randint(0, len(text))].encode()]
    return bodies


def _check(raw: bytes) -> None:
    try:
        want: Any = json.loads(raw)
    except (ValueError, RecursionError):
        want = None
    read = read_object(raw)
    if read is None:
        assert not isinstance(want, dict), raw[:200]
        return
    body, kept = read
    assert _same(body, want), raw[:200]
    # The interception's changes: a value replaced, a value added, a value kept as the same
    # object though set again (a bool is one object).
    upstream = {**body, "model": "imposed", "temperature": 0.5}
    if "stream" in upstream:
        upstream["stream"] = True
    forwarded = kept.forward(upstream)
    assert _same(json.loads(forwarded), json.loads(json.dumps(upstream))), raw[:200]


@pytest.mark.parametrize("raw", EDGES)
def test_reads_what_json_loads_reads_and_forwards_the_same_request(raw: bytes) -> None:
    _check(raw)


def test_random_bodies_and_their_cut_off_halves() -> None:
    for raw in _random_bodies(1500):
        _check(raw)


def test_unchanged_values_are_the_clients_bytes() -> None:
    raw = '{"model" : "m", "input": [1.0E+2, "é", "\\u0041"], "n": 1}'.encode()
    read = read_object(raw)
    assert read is not None
    body, kept = read
    out = kept.forward({**body, "model": "imposed", "n": 2})
    assert out == '{"model": "imposed", "input": [1.0E+2, "é", "\\u0041"], "n": 2}'.encode()
