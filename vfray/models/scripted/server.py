"""The scripted model server: a real OpenAI/Anthropic-compatible ASGI app with deterministic
policies, latency, token ids and error injection (:mod:`vfray.models.scripted._failures`), the
only stand-in for a model provider in tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from vfray.endpoints.chat_template import ChatTemplate
from vfray.endpoints.serving import serve_in_thread
from vfray.models.scripted import render, templated, wire
from vfray.models.scripted._failures import FAIL_COUNT_HEADER as FAIL_COUNT_HEADER
from vfray.models.scripted._failures import FAIL_HEADER as FAIL_HEADER
from vfray.models.scripted._failures import Failure, FailureInjector, error_response
from vfray.models.scripted.conversation import count_tokens
from vfray.models.scripted.policies import POLICIES, Sampler, decide, reply

POLICY_HEADER = "x-scripted-policy"
"""Request header: answer this request with the named policy instead of the server's."""
ROLE_HEADER = "x-vfray-role"
"""Sent by vfray's simulated users and judges (:data:`vfray.endpoints.client.ROLE_HEADER`)."""
LATENCY_HEADER = "x-scripted-latency"
"""Request header: override the per-call latency (seconds); echoed on every completion."""

TOKENS_ROUTE = "/chat/completions/tokens"
"""vLLM's chat route with the prompt as token ids (served with a chat template only)."""


@dataclass(frozen=True)
class ReceivedRequest:
    """A completion request as the scripted model received it (for tests of what a proxy sends)."""

    route: str
    headers: dict[str, str]
    body: dict[str, Any]
    raw: bytes = b""
    """The body's bytes as they arrived."""


_DIALECTS: dict[str, tuple[Callable[[wire.Json], wire.Request], str]] = {
    "/v1/chat/completions": (wire.parse_chat, "chat"),
    "/v1/responses": (wire.parse_responses, "responses"),
    "/v1/messages": (wire.parse_anthropic, "anthropic"),
}


class ScriptedModel:
    """A deterministic model server; the instance is the ASGI app.

    ``policy`` is one of ``echo``, ``arithmetic``, ``bash``, ``tokens`` (see
    :mod:`vfray.models.scripted.policies`) or ``agent`` (drives real agent programs, see
    :mod:`vfray.models.scripted.agent`); one request may ask for another
    (``x-scripted-policy``), and vfray's simulated users and judges get the ``user`` and ``judge``
    policies (:mod:`vfray.models.scripted.side_policies`) by their ``x-vfray-role`` header.
    ``accuracy`` is the
    chance an arithmetic answer is right, drawn from ``seed``, the prompt and a per-call nonce
    (see :class:`Sampler`). ``latency`` is slept before every completion; ``stall`` is slept
    inside every stream, after its head and first event: an agent whose timeout covers the
    wait between events but not the wait for the head (Codex's ``stream_idle_timeout_ms``)
    gives up on the stalled stream and sends the request again. With
    ``context_window`` set, a request whose prompt tokens plus ``max_tokens`` exceed it is
    refused as a context-length error. ``count_tokens=False`` leaves out Anthropic's
    ``/v1/messages/count_tokens`` (as vLLM does). ``tokens=False`` ignores requests for token
    ids and logprobs, as an endpoint that cannot return them does (``scripted:echo?tokens=0``).
    ``fail`` answers every completion with that HTTP status (``scripted:echo?fail=400``).
    ``chat_template`` (chat requests only) serves as vLLM serves a real model: prompts rendered
    by the template, replies tokenized by its tokenizer and closed by its stop token, and vLLM's
    token-in routes (``/v1/chat/completions/tokens``, ``/tokenize``; see
    :mod:`vfray.models.scripted.templated`; ``token_routes=False`` leaves them out, as vLLM < 0.20
    does); ``think`` is the reasoning each reply samples first.
    """

    def __init__(
        self,
        policy: str = "echo",
        *,
        latency: float = 0.0,
        stall: float = 0.0,
        accuracy: float = 1.0,
        seed: int = 0,
        model_name: str = "scripted",
        context_window: int | None = None,
        history_size: int = 1000,
        count_tokens: bool = True,
        tokens: bool = True,
        fail: float | None = None,
        chat_template: ChatTemplate | None = None,
        think: str | None = None,
        token_routes: bool = True,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; expected one of {', '.join(POLICIES)}")
        if fail is not None and not (float(fail).is_integer() and 400 <= fail <= 599):
            raise ValueError(f"fail must be an HTTP status 400-599, got {fail!r}")
        self.fail = None if fail is None else str(int(fail))
        """Every completion is answered with this status (``scripted:echo?fail=500``: an
        endpoint that is down, or refuses every request)."""
        if latency < 0 or stall < 0 or not 0.0 <= accuracy <= 1.0:
            raise ValueError("latency and stall must be >= 0 and accuracy within [0, 1]")
        self.policy, self.latency, self.accuracy, self.seed = policy, latency, accuracy, seed
        self.stall = stall
        self.model_name, self.context_window = model_name, context_window
        self.tokens = bool(tokens)
        self.chat_template = chat_template
        self.think = think
        self.weight_updates = 0
        """``/update_weights`` calls answered (vLLM's weight-update route, stood in for)."""
        self.generated: list[tuple[str, int]] = []
        """Per answered completion: its last user text and ``weight_updates`` when generated."""
        self._resumed = asyncio.Event()
        self._resumed.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._generating = 0
        self.calls = 0
        """Completions answered by the policy (errors and refusals not counted)."""
        self.token_counts = 0
        """``/v1/messages/count_tokens`` requests answered."""
        self.history: deque[ReceivedRequest] = deque(maxlen=history_size)
        """The last ``history_size`` completion requests received, refused ones included."""
        self._sampler = Sampler(seed)
        self._failures = FailureInjector()
        self._app = Starlette(
            routes=[
                *(Route(path, self._complete, methods=["POST"]) for path in _DIALECTS),
                *(
                    [Route("/v1/messages/count_tokens", self._count_tokens, methods=["POST"])]
                    if count_tokens
                    else []
                ),
                *(
                    [
                        Route(f"/v1{TOKENS_ROUTE}", self._complete, methods=["POST"]),
                        Route("/tokenize", self._tokenize, methods=["POST"]),
                    ]
                    if chat_template is not None and token_routes
                    else []
                ),
                Route("/pause", self._pause, methods=["POST"]),
                Route("/resume", self._resume, methods=["POST"]),
                Route("/is_paused", self._is_paused, methods=["GET"]),
                Route("/update_weights", self._update_weights, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
                Route("/health", self._health, methods=["GET"]),
            ]
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._app(scope, receive, send)

    def fail_next(self, kind: int | str, times: int = 1) -> None:
        """Answer the next ``times`` completions with an error (a status or ``context_length``)."""
        self._failures.fail_next(kind, times)

    async def _models(self, request: HttpRequest) -> Response:
        entry = {
            "id": self.model_name,
            "object": "model",
            "created": 0,
            "owned_by": "vfray",
            "type": "model",
            "display_name": self.model_name,
            "created_at": "1970-01-01T00:00:00Z",
        }
        return JSONResponse(
            {
                "object": "list",
                "data": [entry],
                "has_more": False,
                "first_id": self.model_name,
                "last_id": self.model_name,
            }
        )

    async def _count_tokens(self, request: HttpRequest) -> Response:
        try:
            body = json.loads(await request.body())
            if not isinstance(body, dict):
                raise wire.BadRequest("request body must be a JSON object")
            # count_tokens takes no max_tokens; the count is of the prompt's texts alone.
            parsed = wire.parse_anthropic({**body, "max_tokens": 1})
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            failure = Failure(400, f"request body is not valid JSON: {exc}")
            return error_response("anthropic", failure)
        except wire.BadRequest as exc:
            return error_response("anthropic", Failure(400, exc.message, param=exc.param))
        self.token_counts += 1
        return JSONResponse({"input_tokens": count_tokens(list(parsed.conv.texts))})

    async def _tokenize(self, request: HttpRequest) -> Response:
        assert self.chat_template is not None
        try:
            body = json.loads(await request.body())
            if not isinstance(body, dict):
                raise wire.BadRequest("request body must be a JSON object")
            return JSONResponse(templated.tokenize_answer(self.chat_template, body))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            return error_response("chat", Failure(400, f"request body is not valid JSON: {exc}"))
        except wire.BadRequest as exc:
            return error_response("chat", Failure(400, exc.message, param=exc.param))

    # vLLM's RL control plane (VLLM_SERVER_DEV_MODE=1), stood in for: while paused, completions
    # wait before they are generated; a pause that waits for the ones being generated returns
    # once they are done.

    async def _pause(self, request: HttpRequest) -> Response:
        self._resumed.clear()
        if request.query_params.get("wait_for_inflight_requests", "false") == "true":
            await self._idle.wait()
        return JSONResponse({"status": "paused"})

    async def _resume(self, request: HttpRequest) -> Response:
        self._resumed.set()
        return JSONResponse({"status": "resumed"})

    async def _is_paused(self, request: HttpRequest) -> Response:
        return JSONResponse({"is_paused": not self._resumed.is_set()})

    async def _update_weights(self, request: HttpRequest) -> Response:
        if self._resumed.is_set():
            return error_response("chat", Failure(400, "pause generation before updating"))
        self.weight_updates += 1
        return JSONResponse({"status": "ok"})

    async def _health(self, request: HttpRequest) -> Response:
        return JSONResponse(
            {"status": "ok", "policy": self.policy, "model": self.model_name, "calls": self.calls}
        )

    async def _complete(self, request: HttpRequest) -> Response:
        path = request.url.path
        parse, dialect = _DIALECTS["/v1/chat/completions" if path.endswith(TOKENS_ROUTE) else path]
        try:
            return await self._answer(request, parse, dialect)
        except wire.BadRequest as exc:
            return error_response(dialect, Failure(400, exc.message, param=exc.param))
        except Failure as failure:
            return error_response(dialect, failure)

    async def _answer(
        self, request: HttpRequest, parse: Callable[[wire.Json], wire.Request], dialect: str
    ) -> Response:
        raw = await request.body()
        try:
            body = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise wire.BadRequest(f"request body is not valid JSON: {exc}") from None
        if not isinstance(body, dict):
            raise wire.BadRequest("request body must be a JSON object")
        self.history.append(ReceivedRequest(request.url.path, dict(request.headers), body, raw))
        parsed = parse(body)
        self._failures.check(
            request.headers,
            raw,
            parsed,
            dialect,
            fail=self.fail,
            context_window=self.context_window,
        )
        latency = _latency(request.headers.get(LATENCY_HEADER), self.latency)
        await self._resumed.wait()
        self._generating += 1
        self._idle.clear()
        try:
            if latency:
                await asyncio.sleep(latency)
        finally:
            self._generating -= 1
            if not self._generating:
                self._idle.set()
        self.generated.append((parsed.conv.last_user, self.weight_updates))
        conv = parsed.conv
        if not self.tokens:
            conv = dataclasses.replace(conv, want_tokens=False)
        policy = _request_policy(request) or self.policy
        decision = decide(policy, conv, self.accuracy, self._sampler)
        call_id = wire.new_id("toolu_" if dialect == "anthropic" else "call_")
        if self.chat_template is not None and dialect == "chat":
            tokens = body.get("tokens") if request.url.path.endswith(TOKENS_ROUTE) else None
            prompt = templated.prompt_ids(self.chat_template, body, tokens)
            answer = templated.templated_reply(
                self.chat_template, decision, conv, prompt, call_id=call_id, think=self.think
            )
        else:
            answer = reply(decision, conv, policy=policy, call_id=call_id)
        self.calls += 1
        model = parsed.model or self.model_name
        headers = {LATENCY_HEADER: repr(latency)}
        if not parsed.stream:
            to_body = {
                "chat": render.chat_body,
                "responses": render.responses_body,
                "anthropic": render.anthropic_body,
            }[dialect]
            return JSONResponse(to_body(answer, model), headers=headers)
        if dialect == "chat":
            events = render.chat_events(answer, model, parsed.include_usage)
        elif dialect == "responses":
            events = render.responses_events(answer, model)
        else:
            events = render.anthropic_events(answer, model)
        return StreamingResponse(
            _drip(events, self.stall),
            media_type="text/event-stream",
            headers={**headers, "cache-control": "no-cache"},
        )


def _request_policy(request: HttpRequest) -> str | None:
    """The policy this request asks for: ``x-scripted-policy`` (a test's choice), else the
    role vfray's own side calls declare (``x-vfray-role: user`` or ``judge``), else None
    (the server's policy). So one server plays the agent, its simulated user and its judge."""
    asked = request.headers.get(POLICY_HEADER)
    if asked is not None:
        if asked not in POLICIES:
            raise wire.BadRequest(f"{POLICY_HEADER} must be one of {', '.join(POLICIES)}")
        return asked
    role = request.headers.get(ROLE_HEADER)
    return role if role in ("user", "judge") else None


def _latency(header: str | None, default: float) -> float:
    if header is None:
        return default
    try:
        value = float(header)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 600.0:
        raise wire.BadRequest(f"{LATENCY_HEADER} must be a number of seconds in [0, 600]")
    return value


async def _drip(events: list[str], stall: float = 0.0) -> AsyncIterator[bytes]:
    for i, event in enumerate(events):
        yield event.encode()
        if i == 0 and stall:
            await asyncio.sleep(stall)


@contextlib.contextmanager
def scripted_server(policy: str | ScriptedModel = "echo", **options: Any) -> Iterator[str]:
    """Serve a :class:`ScriptedModel` on 127.0.0.1 in a thread; yields a base URL ending in /v1.

    Pass a policy name and :class:`ScriptedModel` keyword options, or a ready model (to inspect
    its ``history`` or call ``fail_next`` while it serves). Anthropic clients take the URL
    without the ``/v1`` suffix.
    """
    model = policy if isinstance(policy, ScriptedModel) else ScriptedModel(policy, **options)
    with serve_in_thread(model) as url:
        yield f"{url}/v1"
