"""The scripted model's injected failures: which completion fails (the ``x-scripted-fail``
header, :meth:`~vfray.models.scripted.server.ScriptedModel.fail_next`'s queue, the server's
``fail`` status, a prompt past its ``context_window``) and the error each dialect answers with,
shaped as OpenAI's and Anthropic's are."""

from __future__ import annotations

import hashlib
import threading
from collections import deque
from collections.abc import Mapping
from typing import Any

from starlette.responses import JSONResponse

from vfray.models.scripted import wire
from vfray.models.scripted.conversation import count_tokens

FAIL_HEADER = "x-scripted-fail"
"""Request header: answer with this error: an HTTP status (400-599) or ``context_length``."""
FAIL_COUNT_HEADER = "x-scripted-fail-count"
"""Request header: fail only the first N identical requests carrying ``x-scripted-fail``."""

_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
}
_ANTHROPIC_TYPES = {**_OPENAI_TYPES, 413: "request_too_large", 529: "overloaded_error"}


class Failure(Exception):
    def __init__(
        self, status: int, message: str, code: str | None = None, param: str | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param


def error_response(dialect: str, failure: Failure) -> JSONResponse:
    status = failure.status
    headers = {"retry-after-ms": "10"} if status == 429 or status >= 500 else {}
    if dialect == "anthropic":
        kind = _ANTHROPIC_TYPES.get(
            status, "api_error" if status >= 500 else "invalid_request_error"
        )
        body: dict[str, Any] = {
            "type": "error",
            "error": {"type": kind, "message": failure.message},
        }
    else:
        kind = _OPENAI_TYPES.get(
            status, "server_error" if status >= 500 else "invalid_request_error"
        )
        code = failure.code or ("rate_limit_exceeded" if status == 429 else None)
        body = {
            "error": {
                "message": failure.message,
                "type": kind,
                "param": failure.param,
                "code": code,
            }
        }
    return JSONResponse(body, status_code=status, headers=headers)


class FailureInjector:
    """The failures a server has been told to inject, and the check each completion passes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # fail_next() is called from test threads
        self._queued: deque[str] = deque()
        self._header_failures: dict[str, int] = {}

    def fail_next(self, kind: int | str, times: int = 1) -> None:
        """Answer the next ``times`` completions with an error (a status or ``context_length``)."""
        failure_kind(str(kind))
        with self._lock:
            self._queued.extend([str(kind)] * times)

    def check(
        self,
        headers: Mapping[str, str],
        raw: bytes,
        parsed: wire.Request,
        dialect: str,
        *,
        fail: str | None,
        context_window: int | None,
    ) -> None:
        """Raise the :class:`Failure` this request is to get, if any."""
        kind = headers.get(FAIL_HEADER)
        if kind is not None:
            failure_kind(kind)
            limit = headers.get(FAIL_COUNT_HEADER)
            if limit is not None:
                if not limit.isdigit():
                    raise wire.BadRequest(f"{FAIL_COUNT_HEADER} must be a non-negative integer")
                # Keyed by body, so an SDK retry of the same request is the one that succeeds.
                key = kind + hashlib.sha256(raw).hexdigest()
                seen = self._header_failures.get(key, 0)
                self._header_failures[key] = seen + 1
                if seen >= int(limit):
                    kind = None
        if kind is None:
            with self._lock:
                kind = self._queued.popleft() if self._queued else None
        kind = kind or fail
        needed = count_tokens(list(parsed.conv.texts)) + (parsed.conv.max_tokens or 0)
        if kind is None and context_window is not None and needed > context_window:
            kind = "context_length"
        if kind == "context_length":
            window = context_window or max(1, needed - 1)
            raise _context_failure(dialect, needed, window)
        if kind is not None:
            raise Failure(int(kind), f"scripted failure {kind} (injected)")


def failure_kind(kind: str) -> None:
    if kind != "context_length" and not (kind.isdigit() and 400 <= int(kind) <= 599):
        raise wire.BadRequest(
            f"{FAIL_HEADER} must be an HTTP status 400-599 or 'context_length', got {kind!r}"
        )


def _context_failure(dialect: str, needed: int, window: int) -> Failure:
    if dialect == "anthropic":
        return Failure(400, f"prompt is too long: {needed} tokens > {window} maximum")
    message = (
        f"This model's maximum context length is {window} tokens. However, you requested "
        f"{needed} tokens. Please reduce the length of the messages."
    )
    return Failure(400, message, code="context_length_exceeded", param="messages")
