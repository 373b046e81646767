"""``POST /v1/messages/count_tokens``: the Anthropic token count of a request, never a model turn.

Claude Code asks for it to decide when to compact. The request goes to the upstream's own
``/messages/count_tokens`` (with the eval's model imposed) when the upstream serves it, as
Anthropic does. When it does not (vLLM and most OpenAI-compatible servers answer 404/405/501),
the interception remembers that and answers an **estimate** from then on: one token per 4 bytes
of the request's ``system``, ``messages`` and ``tools`` as compact UTF-8 JSON, rounded up. JSON
punctuation counts too, so the estimate errs high and a client compacts early rather than late.
An upstream that fails otherwise (5xx, unreachable, unreadable) also gets the estimate, for that
request only. Nothing is recorded on the trace and no limit is spent.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import aiohttp
from starlette.responses import JSONResponse, Response

from vfray.interception.dialects import DIALECTS
from vfray.interception.upstream import Forwarder

PATH = "/messages/count_tokens"
TIMEOUT_S = 30.0
"""A count is a quick question: an upstream slower than this gets the estimate instead."""
_UNSERVED = (404, 405, 501)
_COUNTED_FIELDS = ("system", "messages", "tools")


def estimate(body: Mapping[str, Any]) -> int:
    """ceil(UTF-8 bytes of the compact JSON of ``system``, ``messages`` and ``tools`` / 4)."""
    counted = {k: body[k] for k in _COUNTED_FIELDS if body.get(k) is not None}
    text = json.dumps(counted, separators=(",", ":"), ensure_ascii=False)
    return max(1, math.ceil(len(text.encode()) / 4))


class TokenCounter:
    """Answers count requests: forwarded while the upstream serves them, else estimated."""

    def __init__(self, forwarder: Forwarder) -> None:
        self.forwarder = forwarder
        self.upstream_serves: bool | None = None
        """None until the upstream answered a count; False once it said it has no such route."""

    async def answer(self, body: dict[str, Any], client_headers: Mapping[str, str]) -> Response:
        if self.upstream_serves is not False:
            forwarded = await self._forward(body, client_headers)
            if forwarded is not None:
                return forwarded
        return JSONResponse({"input_tokens": estimate(body)})

    async def _forward(
        self, body: dict[str, Any], client_headers: Mapping[str, str]
    ) -> Response | None:
        upstream = self.forwarder.upstream
        payload = json.dumps({**body, "model": upstream.model}).encode()
        headers = DIALECTS["anthropic"].upstream_headers(upstream.api_key, client_headers)
        try:
            async with self.forwarder.post(PATH, payload, headers, timeout=TIMEOUT_S) as response:
                if response.status in _UNSERVED:
                    self.upstream_serves = False
                    return None
                data = await response.read()
                if 400 <= response.status < 500:
                    # The client's request is at fault (or its key): the upstream says why.
                    content_type = response.headers.get("content-type", "application/json")
                    return Response(data, response.status, {"content-type": content_type})
                if response.status >= 300:
                    return None
                tokens = json.loads(data).get("input_tokens")
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError, AttributeError):
            return None
        if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 0:
            return None
        self.upstream_serves = True
        return JSONResponse({"input_tokens": tokens})
