"""One forwarded turn: the upstream exchange, the SSE relay with its final event held back, and
the single ``ModelCall`` recorded for it.

Upstream failures map to statuses SDKs understand: 429/5xx are relayed (SDKs retry them), a
connection failure is 503, a timeout 504, an unreadable reply 502 (all recorded as the
provider's: ``ProviderError``); any other 4xx is relayed and recorded as the endpoint refusing
that request (:mod:`vfray.endpoints.answers`); a context-length refusal stops the rollout cleanly
(``StopCondition.CONTEXT_LENGTH``) and is relayed as the 400 it is.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

from vfray.endpoints.answers import call_error
from vfray.errors import ConfigError, no_token_ids
from vfray.interception._client_json import ClientJson
from vfray.interception._echo import ECHO_KEY, without_echo
from vfray.interception.dialects import Dialect, ParsedRequest, ParsedResponse
from vfray.interception.dialects.base import Action, SSESplitter, parse_sse_block
from vfray.interception.exchange import Exchange
from vfray.interception.sessions import Session
from vfray.interception.token_in import TokenIn, note
from vfray.interception.upstream import Forwarder
from vfray.trace import ErrorInfo, StopCondition
from vfray.trace.storable import storable_message

CONTEXT_LENGTH_MARKERS = (
    "context_length_exceeded",
    "maximum context length",
    "prompt is too long",
    "context length",
    "context window",
)
_RELAYED_HEADERS = ("retry-after", "retry-after-ms", "x-should-retry")
JSON_HEADERS = {"content-type": "application/json"}
SSE_HEADERS = {"content-type": "text/event-stream", "cache-control": "no-cache"}


class UnreadableReply(Exception):
    """The upstream answered 2xx with a body vfray cannot read (not JSON, wrong shape)."""


def is_context_length_error(status: int, text: str) -> bool:
    lowered = text.lower()
    return status in (400, 413, 422) and any(m in lowered for m in CONTEXT_LENGTH_MARKERS)


@dataclass
class Turn:
    """Everything needed to run and record one call, fixed when the request was admitted."""

    session: Session
    dialect: Dialect
    request: ParsedRequest
    upstream_body: dict[str, Any]
    client_wants_usage: bool
    client_headers: dict[str, str]
    model: str
    api_key: str | None
    policy_version: int | None
    require_tokens: bool = False
    """The session asked for token ids as required (a training stream): an answer without them
    stops the rollout at once, rather than after the agent ran to its end."""
    started_at: float = 0.0
    streamed: bool = False
    recorded: bool = False
    path: str | None = None
    """Where the body goes when not the dialect's own route (the token-in route)."""
    sent_tokens: list[int] | None = None
    """The prompt sent as token ids (token-in), recorded when the reply does not echo them."""
    tokens_json: str | None = None
    """``sent_tokens`` as JSON, spliced into the body rather than encoded again."""
    token_in: TokenIn | None = None
    plain_request: ParsedRequest | None = None
    """The request as the client sent it, when token-in recorded the branch's history instead."""
    client_json: ClientJson | None = None
    """The client's body with its members' text, where nothing but the interception's own
    top-level changes can have touched ``upstream_body``: the values it did not change are
    forwarded as that text rather than serialised again."""

    def record(self, reply: ParsedResponse | None, error: ErrorInfo | None = None) -> None:
        """Append exactly one ModelCall, unless the rollout concluded meanwhile."""
        if self.recorded or self.session.concluded:
            # One ModelCall per exchange; and a concluded rollout has taken its trace, so
            # mutating it now would race whoever is writing it.
            return
        reply = reply or ParsedResponse(message=None)
        if error is None and reply.error is not None:
            error = ErrorInfo(type="ProviderError", message=f"upstream stream error: {reply.error}")
        message = reply.message
        if message is not None:
            message, replaced = storable_message(message)
            if message is not reply.message:
                self.session.trace.notes.append(
                    f"call {len(self.session.trace.calls)}: the reply's text held UTF-16 "
                    f"surrogates (split pairs joined, {replaced} lone one(s) recorded as U+FFFD; "
                    "the agent got the reply as sent)"
                )
        # ``recorded`` is set only once the call is on the trace: one that could not be recorded
        # is then recorded by run_turn's fallback as an InterceptionError, never dropped unsaid.
        self.session.trace.record_call(
            self.request.messages,
            message,
            dialect=self.dialect.name,
            model=self.model,
            sampling=self.dialect.recorded_sampling(self.upstream_body),
            usage=reply.usage,
            started_at=self.started_at,
            ended_at=time.time(),
            finish_reason=reply.finish_reason,
            streamed=self.streamed,
            error=error,
            policy_version=self.policy_version,
            tools=self.request.tools,
            prompt_token_ids=(
                reply.prompt_token_ids if reply.prompt_token_ids is not None else self.sent_tokens
            ),
            completion_token_ids=reply.completion_token_ids,
            completion_logprobs=reply.completion_logprobs,
        )
        self.recorded = True
        if (
            self.require_tokens
            and error is None
            and reply.message is not None
            and reply.completion_token_ids is None
        ):
            # The later calls are refused and the harness is stopped: its samples could not be
            # trained on, and the training stream ends the run on this rollout's outcome.
            self.session.trace.add_error(ConfigError(no_token_ids(self.model)), "agent")
            self.session.trace.stop(StopCondition.ERROR)

    def fail(self, exchange: Exchange, status: int, message: str, kind: str) -> None:
        """Answer with vfray's own error (if nothing was sent yet) and record it on the call."""
        self.record(None, ErrorInfo(type=kind, message=message))
        self.answer_error(exchange, status, message)

    def answer_error(self, exchange: Exchange, status: int, message: str) -> None:
        """Answer with vfray's own error, unless the answer has started; records nothing."""
        if exchange.status == 0:
            exchange.start(status, dict(JSON_HEADERS))
            exchange.push(json.dumps(self.dialect.error_body(status, message)).encode())


async def run_turn(turn: Turn, forwarder: Forwarder, exchange: Exchange) -> None:
    """Forward ``turn`` upstream, feeding ``exchange``; always records and finishes it."""
    turn.started_at = time.time()
    body = _body(turn)
    headers = turn.dialect.upstream_headers(turn.api_key, turn.client_headers)
    try:
        stream = turn.request.stream
        path = turn.path or turn.dialect.path
        async with forwarder.post(path, body, headers, stream=stream) as response:
            if response.status == 404 and turn.path is not None:
                tokens_unsupported = True
            else:
                tokens_unsupported = False
                await _relay(turn, response, exchange)
        if tokens_unsupported:
            # The endpoint has no token-in route: this call, and the app's later ones, go as
            # messages; said on the trace, since its branch may now break.
            if turn.token_in is not None:
                turn.token_in.supported = False
            note(turn.session.trace, f"{path} answered 404: calls go as messages")
            turn.path = turn.sent_tokens = turn.tokens_json = None
            if turn.plain_request is not None:
                turn.request = turn.plain_request
            plain = {k: v for k, v in turn.upstream_body.items() if k != "tokens"}
            body = json.dumps(plain).encode()
            async with forwarder.post(turn.dialect.path, body, headers, stream=stream) as response:
                await _relay(turn, response, exchange)
    except TimeoutError:
        settings = forwarder.settings
        if turn.request.stream:
            message = (
                "upstream model endpoint timed out: its stream was silent for "
                f"{settings.stream_idle_timeout:g} s (interception.stream_idle_timeout)"
            )
        else:
            message = (
                "upstream model endpoint timed out: no answer within "
                f"{settings.upstream_timeout:g} s (interception.upstream_timeout)"
            )
        turn.fail(exchange, 504, message, "ProviderError")
    except UnreadableReply as exc:
        message = f"the upstream model endpoint sent an unreadable reply ({exc})"
        turn.fail(exchange, 502, message, "ProviderError")
    except (aiohttp.ClientError, OSError) as exc:
        detail = f"{type(exc).__name__}: {exc}"
        if exchange.status == 0:
            message = f"upstream model endpoint unreachable ({detail})"
        else:
            message = f"upstream stream broke ({detail})"
        turn.fail(exchange, 503, message, "ProviderError")
    except Exception as exc:  # vfray's own failure to record must not surface as a 500
        message = f"could not process the upstream reply ({type(exc).__name__}: {exc})"
        turn.fail(exchange, 502, message, "InterceptionError")
    except asyncio.CancelledError:
        # Its rollout concluded, or the interception is closing: nothing is recorded (the trace
        # was handed over, or is being dropped), and no one counts this as the endpoint's
        # failure. A client still waiting gets an answer rather than a request that never ends.
        turn.answer_error(exchange, 503, "the rollout ended while this call was at the model")
        raise
    finally:
        exchange.finish()


def _body(turn: Turn) -> bytes:
    body = turn.upstream_body
    if turn.tokens_json is None or body.get("tokens") is not turn.sent_tokens:
        return _json(turn, body)
    # The prompt's ids as the JSON token-in already holds, not encoded again.
    rest = _json(turn, {k: v for k, v in body.items() if k != "tokens"})
    comma = b", " if rest != b"{}" else b""
    return rest[:-1] + comma + b'"tokens": ' + turn.tokens_json.encode() + b"}"


def _json(turn: Turn, body: dict[str, Any]) -> bytes:
    if turn.client_json is not None:
        return turn.client_json.forward(body)
    return json.dumps(body).encode()


async def _relay(turn: Turn, response: aiohttp.ClientResponse, exchange: Exchange) -> None:
    if response.status >= 400:
        await _relay_error(turn, response, exchange)
    elif response.content_type == "text/event-stream":
        await _relay_stream(turn, response, exchange)
    else:
        await _relay_json(turn, response, exchange)


async def _relay_error(turn: Turn, response: aiohttp.ClientResponse, exchange: Exchange) -> None:
    data = await response.read()
    text = data.decode("utf-8", "replace")
    headers = {
        "content-type": response.headers.get("content-type", "application/json"),
        **{h: response.headers[h] for h in _RELAYED_HEADERS if h in response.headers},
    }
    if is_context_length_error(response.status, text):
        turn.session.trace.stop(StopCondition.CONTEXT_LENGTH)
    # A refusal (a 4xx but 408/429) says so in its record: the run then keeps it as this
    # rollout's own error instead of retrying it as an outage.
    error = ErrorInfo(type="ProviderError", message=call_error(response.status, text[:1000]))
    turn.record(None, error)
    exchange.start(response.status, headers)
    exchange.push(turn.dialect.client_error(response.status, data))


async def _relay_json(turn: Turn, response: aiohttp.ClientResponse, exchange: Exchange) -> None:
    data = await response.read()
    try:
        # A call sent as tokens: its echo of them is checked as bytes, not parsed.
        read = data if turn.tokens_json is None else without_echo(data, turn.tokens_json)
        body = json.loads(read)
        if not isinstance(body, dict):
            raise ValueError(f"a JSON {type(body).__name__}, not an object")
        reply = turn.dialect.parse_response(body)
    except Exception as exc:
        raise UnreadableReply(f"{type(exc).__name__}: {exc}") from exc
    turn.record(reply)
    exchange.start(response.status, dict(JSON_HEADERS))
    exchange.push(turn.dialect.client_reply(data, reply, turn.model))


async def _relay_stream(turn: Turn, response: aiohttp.ClientResponse, exchange: Exchange) -> None:
    turn.streamed = True
    exchange.start(response.status, dict(SSE_HEADERS))
    accumulator = turn.dialect.accumulator(turn.client_wants_usage)
    splitter = SSESplitter()
    held: list[bytes] = []
    echo = turn.tokens_json  # a call sent as tokens: the event that echoes them is checked
    async for chunk in response.content.iter_any():
        relay = []
        for block in splitter.feed(chunk):
            read = block
            if echo is not None and ECHO_KEY in block:
                read, echo = without_echo(block, echo), None
            try:
                action = accumulator.feed(parse_sse_block(read))
            except Exception as exc:
                raise UnreadableReply(f"stream event: {type(exc).__name__}: {exc}") from exc
            if action is Action.RELAY:
                relay.append(accumulator.rewrite(block))
            elif action is Action.HOLD:
                held.append(accumulator.rewrite(block))
        exchange.push(b"".join(relay))
    exchange.push(accumulator.rewrite(splitter.rest()))
    # The turn is on the trace before the client sees the final event, so a client that
    # exits on [DONE] / response.completed / message_stop cannot race scoring.
    turn.record(accumulator.result())
    exchange.push(b"".join(held))
