"""vfray's own model calls (a simulated user's turns, a judge's verdicts): the endpoint they go
to, one chat-completions call with retries, and the record of every attempt on the trace's
``side_calls``, apart from the agent's calls.

By default they go to the rollout's own model endpoint. The rollout (:mod:`vfray.rollout`) makes
it current for its phases in a context variable: judges and users are called from inside hooks
whose arguments are injected by name, and the variable follows them onto hook threads and tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from vfray.errors import ConfigError, ProviderError
from vfray.trace import ErrorInfo, Message, SideCall, Trace, Usage

ROLE_HEADER = "x-vfray-role"
"""Sent on every side call with its kind (``user``/``judge``), so an endpoint's logs (and the
scripted model's policy choice) can tell them from the agent's calls."""

RETRY_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504, 529})
BACKOFF_S = 0.5
MAX_BACKOFF_S = 8.0


class ModelEndpoint(BaseModel):
    """Where a judge or simulated user sends its calls. Unset fields fall back to the
    rollout's model endpoint: ``base_url`` None is the rollout's endpoint (and its key),
    ``model`` None the rollout's model."""

    model_config = ConfigDict(frozen=True)

    base_url: str | None = None
    """An OpenAI-compatible endpoint ending in ``/v1``."""
    model: str | None = None
    api_key_var: str | None = None
    """Environment variable holding the key, read where the call runs (never travels)."""
    sampling: dict[str, Any] = Field(default_factory=dict)
    """Extra request fields, e.g. ``{"temperature": 0}``."""
    timeout: float = Field(120.0, gt=0)
    """Seconds one attempt may take."""


@dataclass(frozen=True)
class Target:
    """An endpoint resolved in this process: URL, model and key (never put on a trace)."""

    base_url: str
    model: str
    api_key: str | None = None

    def __repr__(self) -> str:
        return f"Target({self.base_url!r}, model={self.model!r})"


_ROLLOUT_TARGET: contextvars.ContextVar[Target | None] = contextvars.ContextVar(
    "vfray_rollout_target", default=None
)


@contextlib.contextmanager
def rollout_target(target: Target | None) -> Iterator[None]:
    """Make ``target`` the rollout's endpoint for the code (and tasks) run inside."""
    token = _ROLLOUT_TARGET.set(target)
    try:
        yield
    finally:
        _ROLLOUT_TARGET.reset(token)


def resolve(endpoint: ModelEndpoint | None, what: str) -> Target:
    """The endpoint's target here; unset parts come from the rollout's endpoint."""
    endpoint = endpoint or ModelEndpoint()
    rollout = _ROLLOUT_TARGET.get()
    if endpoint.base_url is not None:
        key = None
        if endpoint.api_key_var:
            key = os.environ.get(endpoint.api_key_var)
            if key is None:
                raise ConfigError(
                    f"{what}: environment variable {endpoint.api_key_var} (the API key) is not set"
                )
        model = endpoint.model or (rollout.model if rollout is not None else None)
        if model is None:
            raise ConfigError(f"{what}: name a model for its endpoint {endpoint.base_url}")
        return Target(endpoint.base_url.rstrip("/"), model, key)
    if rollout is None:
        raise ConfigError(
            f"{what} has no model endpoint: outside a rollout, give it one "
            "(endpoint=vf.ModelEndpoint(base_url=..., model=...))"
        )
    return Target(rollout.base_url, endpoint.model or rollout.model, rollout.api_key)


class Unusable(Exception):
    """Raised by a caller's ``accept`` when a reply came back but cannot be used (retried)."""


@dataclass(frozen=True)
class Reply:
    text: str
    usage: Usage
    attempts: int


async def chat(
    messages: Sequence[Message],
    *,
    kind: str,
    name: str,
    endpoint: ModelEndpoint | None,
    trace: Trace | None,
    retries: int = 2,
    extra: Mapping[str, Any] | None = None,
    accept: Any = None,
) -> tuple[Reply, Any]:
    """Send ``messages`` as one chat completion, retrying up to ``retries`` more times when
    the endpoint fails transiently (429, 5xx, a lost connection) or ``accept(text)`` raises
    :class:`Unusable`/``ValueError``. Every attempt that reached the endpoint is recorded on
    ``trace.side_calls``. Returns the reply and what ``accept`` returned; raises
    :class:`ProviderError` (the endpoint) or the last ``ValueError`` (the answer) otherwise."""
    import httpx  # here: judges and users are declared at import, called only in rollouts

    what = f"{kind} {name!r}"
    target = resolve(endpoint, what)
    settings = endpoint or ModelEndpoint()
    body: dict[str, Any] = {
        "model": target.model,
        "messages": [m.model_dump(exclude_none=True) for m in messages],
        **settings.sampling,
        **(extra or {}),
        "stream": False,
    }
    headers = {ROLE_HEADER: kind}
    if target.api_key:
        headers["authorization"] = f"Bearer {target.api_key}"
    failure: Exception | None = None
    async with httpx.AsyncClient(timeout=settings.timeout) as client:
        for attempt in range(retries + 1):
            if attempt and isinstance(failure, ProviderError):
                await asyncio.sleep(min(BACKOFF_S * 2 ** (attempt - 1), MAX_BACKOFF_S))
            started = time.time()
            text: str | None = None
            usage = Usage()
            try:
                response = await client.post(
                    f"{target.base_url}/chat/completions", json=body, headers=headers
                )
            except httpx.HTTPError as exc:
                failure = ProviderError(f"{what}: {type(exc).__name__}: {exc}")
                _record(trace, kind, name, target, messages, None, usage, started, failure)
                continue
            if response.status_code != 200:
                failure = ProviderError(
                    f"{what}: the endpoint answered {response.status_code}: {response.text[:300]}"
                )
                _record(trace, kind, name, target, messages, None, usage, started, failure)
                if response.status_code in RETRY_STATUSES:
                    continue
                raise failure
            try:
                text, usage = _parse_completion(response.json())
            except (ValueError, KeyError, IndexError, TypeError) as exc:
                failure = ProviderError(f"{what}: not a chat completion: {exc}")
                _record(trace, kind, name, target, messages, None, usage, started, failure)
                continue
            try:
                accepted = accept(text) if accept is not None else text
            except Exception as exc:
                # Recorded whatever it is: the attempt was billed. Only these are asked again.
                _record(trace, kind, name, target, messages, text, usage, started, exc)
                if not isinstance(exc, Unusable | ValueError):
                    raise
                failure = exc
                continue
            _record(trace, kind, name, target, messages, text, usage, started, None)
            return Reply(text, usage, attempt + 1), accepted
    assert failure is not None
    raise failure


def _parse_completion(payload: Any) -> tuple[str, Usage]:
    choice = payload["choices"][0]
    content = choice["message"].get("content")
    text = content if isinstance(content, str) else ""
    raw = payload.get("usage") or {}
    usage = Usage(
        input_tokens=int(raw.get("prompt_tokens") or 0),
        output_tokens=int(raw.get("completion_tokens") or 0),
    )
    return text, usage


def _record(
    trace: Trace | None,
    kind: str,
    name: str,
    target: Target,
    messages: Sequence[Message],
    reply: str | None,
    usage: Usage,
    started: float,
    error: Exception | None,
) -> None:
    if trace is None:
        return
    trace.side_calls.append(
        SideCall(
            kind=kind,
            name=name,
            model=target.model,
            messages=list(messages),
            reply=reply,
            usage=usage,
            started_at=started,
            ended_at=time.time(),
            error=None if error is None else ErrorInfo.from_exception(error),
        )
    )
