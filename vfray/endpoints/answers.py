"""What a model endpoint's error answer means: an outage (5xx, 408, 429, no answer), which the
run rides out with retries and its circuit, or a refusal of this one request (any other 4xx:
a malformed request, an unknown model, a wrong path), which no retry or wait can change; and
the answer in one short line for the preflight and the progress line.

Why: a 400 "invalid request" counted as an outage was retried and opened the circuit, so a
40-rollout run that should take seconds had not finished after 900 s.
"""

from __future__ import annotations

import json
import re

OUTAGE_4XX = frozenset({408, 429})
"""4xx statuses that say the endpoint is busy or slow, not that the request is wrong."""
REFUSED = "upstream refused the request"
"""How the interception's record of a refused call starts (see :func:`call_error`)."""

_RECORDED = re.compile(r"upstream (?:refused the request \()?HTTP (\d{3})\)?: ", re.DOTALL)


def is_refusal(status: int) -> bool:
    """A 4xx other than 408/429: the endpoint refused this request itself."""
    return 400 <= status < 500 and status not in OUTAGE_4XX


def call_error(status: int, body: str) -> str:
    """The recorded error of a call the upstream answered with ``status``: ``upstream refused
    the request (HTTP 400): …`` for a refusal, ``upstream HTTP 500: …`` otherwise."""
    if is_refusal(status):
        return f"{REFUSED} (HTTP {status}): {body}"
    return f"upstream HTTP {status}: {body}"


def is_refused(message: str) -> bool:
    """Whether an error message (a call's, or a rollout's that quotes it) is a refusal."""
    return REFUSED in message


def gist(body: str | bytes, limit: int = 80) -> str:
    """The start of an error body on one line: the ``error.message`` of an OpenAI or Anthropic
    error object when it has one, else the text itself."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    try:
        payload = json.loads(text)
    except ValueError:
        payload = None
    if isinstance(payload, dict):
        error = payload.get("error", payload.get("detail"))
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            text = error["message"]
        elif isinstance(error, str):
            text = error
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def describe(status: int, body: str | bytes, limit: int = 80) -> str:
    """``HTTP 404: Not Found``: an answer's status and the start of its body."""
    said = gist(body, limit)
    return f"HTTP {status}: {said}" if said else f"HTTP {status}"


def short(message: str, limit: int = 80) -> str:
    """A recorded call error (``upstream HTTP 500: {json}``, ``upstream model endpoint
    unreachable (…)``) in one short line: ``HTTP 500: boom``."""
    found = _RECORDED.search(message)
    if found is not None:
        return describe(int(found.group(1)), message[found.end() :], limit)
    text = " ".join(message.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
