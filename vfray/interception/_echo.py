"""An endpoint's echo of the prompt ids a call sent as tokens, checked as bytes and cut from the
reply before it is parsed.

A call sent as token ids (:mod:`~vfray.interception.token_in`) asks for the reply's token ids,
and vLLM answers with the prompt's ids too (``prompt_token_ids``): the whole branch, thousands
of ids, echoed on every turn. Parsing them is most of what reading the reply costs (``json``
makes each id from its digits), and they are the ids the interception itself sent. So the
echo's text is compared with the JSON that was sent, as bytes, and where they are the same the
list is replaced by ``null`` before parsing: the call records the ids it sent
(:meth:`~vfray.interception.turns.Turn.record` falls back to them). An echo that differs, or
that this does not find, is parsed as before and recorded as the endpoint gave it.
"""

from __future__ import annotations

import re

ECHO_KEY = b'"prompt_token_ids"'
"""The echo's key (vLLM's name), as the reply's bytes hold it."""
_ECHO = re.compile(re.escape(ECHO_KEY) + rb"\s*:\s*\[")


def without_echo(data: bytes, sent: str) -> bytes:
    """``data`` with its first ``prompt_token_ids`` list replaced by ``null`` where that list is
    ``sent`` (the ids' JSON, written compact as vLLM and Starlette write theirs; spaces in the
    echo are allowed); else ``data`` as it is."""
    # A match is a key, never text inside a string: there its quotes would be escaped.
    found = _ECHO.search(data)
    if found is None:
        return data
    start = found.end() - 1
    end = data.find(b"]", start) + 1
    if end == 0:
        return data
    echo = data[start:end]
    expected = sent.encode()
    if echo != expected and echo.replace(b" ", b"") != expected:
        return data
    return b"%snull%s" % (data[:start], data[end:])
