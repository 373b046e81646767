"""The registry of live rollout sessions, keyed by a hash of each rollout's 128-bit secret.

Only the SHA-256 digest of a secret is kept, so neither the registry nor a trace holds it, and
lookup time does not depend on how much of a guessed secret is right.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from vfray.interception.dialects.base import ParsedRequest
from vfray.interception.dialects.prefix import PrefixCache
from vfray.interception.exchange import Exchange
from vfray.interception.limits import Limits
from vfray.interception.token_in import SentTokens
from vfray.trace import Trace

StopCheck = Callable[[Trace], Awaitable[str | None]]
"""The task's ``@stop`` hooks as one callable: returns the name of a hook that fired, or None."""


@dataclass(frozen=True)
class PendingRequest:
    """The model call being admitted, while its stop check runs."""

    body: dict[str, Any] | None
    """Its JSON body as the client sent it (``@stop`` hooks may ask for it as ``request``)."""
    parsed: ParsedRequest
    """The same call normalized across dialects (verifiers v1's request stops read it)."""


PENDING_REQUEST: ContextVar[PendingRequest | None] = ContextVar(
    "vfray_pending_request", default=None
)
"""Set by the interception's handler for its stop check only (this request's context)."""

_CONCLUDED_KEPT = 100_000  # tombstones kept so late calls are told the rollout concluded
_RECENT_KEPT = 8
"""Exchanges remembered per session for retries: a main agent and its concurrent sub-agents
(or title/summary calls) each keep theirs."""


def digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode("utf-8", "surrogateescape")).digest()


@dataclass(eq=False)
class Session:
    """One rollout's state in the proxy: its trace, budgets, its recent exchanges (for retries)
    and its recently parsed history."""

    key: bytes
    trace: Trace
    limits: Limits = field(default_factory=Limits)
    stop_check: StopCheck | None = None
    sampling: dict[str, Any] | None = None
    concluded: bool = False
    recent: OrderedDict[bytes, Exchange] = field(default_factory=OrderedDict)
    """The session's latest exchanges by request-body digest, newest last."""
    refusals: int = 0
    """Calls refused as bad client input (malformed, oversized)."""
    parsed: PrefixCache = field(default_factory=PrefixCache)
    """The session's recent requests as parsed, so each call parses only its new messages."""
    sent_tokens: SentTokens | None = None
    """What token-in last sent as token ids, with their JSON (reused by the next call)."""
    turns: set[asyncio.Task[None]] = field(default_factory=set)
    """Its calls still at the model. Cancelled when the session concludes: a call of a rollout
    that ended (its agent timed out or was stopped) would otherwise keep the model generating
    an answer no one reads, for up to ``upstream_timeout``."""

    def same_call(
        self,
        body_digest: bytes,
        marked_retry: bool,
        window: float | None,
        raw: bytes = b"",
        body: Any = None,
    ) -> Exchange | None:
        """The exchange a request with this body repeats, if it is a retry of it.

        The same body is the same bytes, or (given ``raw`` and its parsed ``body``) the same JSON
        with its object keys in another order: Codex serializes a map in its requests
        (``client_metadata``) in a fresh order on every send, retries included. A request marked
        as a retry (``x-stainless-retry-count > 0``) repeats any remembered exchange with its
        body. An unmarked one (Claude Code and litellm send 0 on every retry) repeats it while it
        is in flight, or for ``window`` seconds after it finished: an agent that used the answer
        sends a longer history next, so the same bytes again mean the answer was lost on the way.
        ``window=None`` coalesces marked retries only.
        """
        exchange = self.recent.get(body_digest)
        if exchange is None and raw:
            exchange = self._reordered(raw, body)
        if exchange is None or marked_retry:
            return exchange
        if window is None:
            return None
        finished = exchange.finished_at
        if finished is None or time.monotonic() - finished <= window:
            return exchange
        return None

    def _reordered(self, raw: bytes, body: Any) -> Exchange | None:
        """The newest remembered exchange whose request is ``body`` with its keys reordered.
        Reordering keeps the byte length, so only requests as long as this one are parsed
        (rarely any but a re-send): the common miss costs a length comparison per exchange."""
        for old in reversed(self.recent.values()):
            if len(old.request) == len(raw) and json.loads(old.request) == body:
                return old
        return None

    def remember(self, exchange: Exchange, window: float | None) -> None:
        """Keep ``exchange`` for retries; forget the oldest past the bound, and finished ones
        that only a marked retry could still reach (the newest is always kept for those)."""
        recent = self.recent
        recent.pop(exchange.body_digest, None)
        if window is not None:
            now = time.monotonic()
            stale = [
                key
                for key, old in recent.items()
                if old.finished_at is not None and now - old.finished_at > window
            ]
            for key in stale:
                del recent[key]
        recent[exchange.body_digest] = exchange
        while len(recent) > _RECENT_KEPT:
            recent.popitem(last=False)


class SessionRegistry:
    """Secret → :class:`Session`; concluded secrets are remembered (bounded) to say so."""

    def __init__(self) -> None:
        self._live: dict[bytes, Session] = {}
        self._concluded: OrderedDict[bytes, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._live)

    def register(
        self,
        trace: Trace,
        limits: Limits | None = None,
        stop_check: StopCheck | None = None,
        sampling: dict[str, Any] | None = None,
    ) -> str:
        secret = secrets.token_hex(16)
        key = digest(secret)
        self._live[key] = Session(
            key=key,
            trace=trace,
            limits=limits or Limits(),
            stop_check=stop_check,
            sampling=dict(sampling) if sampling is not None else None,
        )
        return secret

    def lookup(self, secret: str) -> Session | None:
        """The live session of ``secret``, or None."""
        key = digest(secret)
        session = self._live.get(key)
        if session is not None and hmac.compare_digest(session.key, key):
            return session
        return None

    def was_concluded(self, secret: str) -> bool:
        return digest(secret) in self._concluded

    def conclude(self, secret: str) -> Trace:
        """End a session: later calls with its secret get 409. Raises KeyError if unknown."""
        key = digest(secret)
        session = self._live.pop(key)
        session.concluded = True
        for turn in session.turns:
            turn.cancel()  # closes its upstream connection: the endpoint stops generating
        self._concluded[key] = None
        while len(self._concluded) > _CONCLUDED_KEPT:
            self._concluded.popitem(last=False)
        return session.trace
