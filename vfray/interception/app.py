"""The interception ASGI app: its routes, the body cap, retry coalescing and one model call.

:class:`InterceptionApp` is a plain ASGI callable, so the same object serves under uvicorn
in-process and inside a Ray Serve replica. :class:`Interception` serves one on 127.0.0.1 for
tests and single-process runs. Who may call, and why a call is refused, is
:mod:`~vfray.interception.admission`; token-in's hook on a call is
:mod:`~vfray.interception.token_in_hook`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from types import TracebackType
from typing import Any

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from vfray.endpoints.chat_template import ChatTemplate
from vfray.endpoints.serving import GRACEFUL_SHUTDOWN_S, HeadLimits, serve_in_loop
from vfray.interception._incoming import Incoming, RequestError, parse_json, parse_json_kept
from vfray.interception._relay import respond
from vfray.interception.admission import authenticate, note_refusal, refusal, refused
from vfray.interception.count_tokens import PATH as COUNT_TOKENS_PATH
from vfray.interception.count_tokens import TokenCounter, estimate
from vfray.interception.dialects import DIALECTS, Dialect, DialectError
from vfray.interception.dialects.gemini import GeminiDialect, counted_fields, gemini_method
from vfray.interception.exchange import Exchange
from vfray.interception.limits import Limits
from vfray.interception.resent import as_replied
from vfray.interception.sessions import (
    PENDING_REQUEST,
    PendingRequest,
    Session,
    SessionRegistry,
    StopCheck,
)
from vfray.interception.settings import InterceptionSettings
from vfray.interception.token_in import TokenIn
from vfray.interception.token_in_hook import send_as_tokens
from vfray.interception.turns import Turn, run_turn
from vfray.interception.upstream import Forwarder, Upstream
from vfray.scoring import PENDING_BODY
from vfray.trace import Trace

DEFAULT_RETRY_WINDOW_S = 10.0
"""Real clients back off 0.5-8 s before retrying a lost answer (Claude Code, litellm)."""
RETRY_HEADER = "x-stainless-retry-count"


def _is_retry(request: Request) -> bool:
    try:
        return int(request.headers.get(RETRY_HEADER, "0")) > 0
    except ValueError:
        return False


def _plain_error(status: int, message: str) -> Response:
    return JSONResponse({"error": {"message": message, "type": "invalid_request_error"}}, status)


async def _lifespan(receive: Receive, send: Send) -> None:
    """Answer an ASGI server's lifespan protocol: nothing to start or stop here."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


class InterceptionApp:
    """Records, limits and forwards every model call of the rollouts registered with it."""

    def __init__(
        self,
        upstream: Upstream,
        *,
        settings: InterceptionSettings | None = None,
        max_body_bytes: int | None = None,
        forward_headers: Collection[str] = (),
        connection_limit: int = 16384,
        retry_window_s: float | None = DEFAULT_RETRY_WINDOW_S,
    ) -> None:
        if retry_window_s is not None and not retry_window_s >= 0:
            raise ValueError(f"retry_window_s must be >= 0 or None, got {retry_window_s!r}")
        self.upstream = upstream
        self.retry_window_s = retry_window_s
        """A byte-identical request (or the same JSON, keys reordered) in the same session while
        the first is in flight, or this many seconds after it was answered, is a retry of it:
        answered from it, never sampled (and recorded) again. None: only requests marked
        ``x-stainless-retry-count > 0``."""
        self.settings = settings or InterceptionSettings()
        """Timeouts, the body cap and SSE keepalives (the config's ``interception``)."""
        self.max_body_bytes = (
            max_body_bytes if max_body_bytes is not None else self.settings.max_body_bytes
        )
        self.forward_headers = frozenset(h.lower() for h in forward_headers)
        """Client headers relayed upstream as they are (e.g. a session-affinity header)."""
        self.policy_version: int | None = None
        """Stamped on every ModelCall recorded from now on (RL: the weights that sampled it)."""
        self.sessions = SessionRegistry()
        self.forwarder = Forwarder(upstream, connection_limit, self.settings)
        self.token_in: TokenIn | None = None
        """Token-in/token-out (``settings.token_in``): later turns of a branch go as token ids."""
        if self.settings.token_in:
            self.token_in = (
                TokenIn.local(ChatTemplate.load(self.settings.tokenizer))
                if self.settings.tokenizer
                else TokenIn.endpoint(self.forwarder)
            )
        self._tasks: set[asyncio.Task[None]] = set()
        self.closing = False
        """Set when the listener is closing (a Serve replica then fails its health check)."""
        # A plain path → (method, handler) table instead of a Starlette router: routing and
        # Starlette's default middlewares were ~10% of the proxy's CPU per turn.
        self._routes: dict[str, tuple[str, Callable[[Request], Awaitable[Response]]]] = {
            f"/v1{dialect.path}": ("POST", self._endpoint(dialect)) for dialect in DIALECTS.values()
        }
        self.token_counter = TokenCounter(self.forwarder)
        self._routes[f"/v1{COUNT_TOKENS_PATH}"] = ("POST", self._count_tokens)
        self._routes["/v1/models"] = ("GET", self._models)
        self._routes["/health"] = ("GET", self._health)
        # Gemini names the model and the method in the path: /v1beta/models/NAME:METHOD.
        self._gemini_dialect = GeminiDialect(stream=False)
        self._gemini = {
            "generateContent": self._endpoint(self._gemini_dialect),
            "streamGenerateContent": self._endpoint(GeminiDialect(stream=True)),
            "countTokens": self._gemini_count_tokens,
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        route = self._routes.get(scope["path"])
        if route is None and (method := gemini_method(scope["path"])) in self._gemini:
            route = ("POST", self._gemini[method])
        if route is None:
            response: Response = _plain_error(404, f"no route {scope['path']}")
        elif scope["method"] != route[0] and not (route[0] == "GET" and scope["method"] == "HEAD"):
            response = _plain_error(405, f"{scope['path']} accepts {route[0]} only")
        else:
            # A handler cancelled by its server's shutdown is answered by vfray.endpoints.serving.
            response = await route[1](Request(scope, receive))
        await response(scope, receive, send)

    # -- sessions -----------------------------------------------------------------------

    def register(
        self,
        trace: Trace,
        limits: Limits | None = None,
        stop_check: StopCheck | None = None,
        sampling: dict[str, Any] | None = None,
    ) -> str:
        """Open a rollout session; returns its fresh 128-bit secret (the harness's API key).

        ``sampling`` overrides the upstream's sampling parameters for this rollout only.
        """
        return self.sessions.register(trace, limits, stop_check, sampling)

    def conclude(self, secret: str) -> Trace:
        """Close a session and return its trace; later calls with the secret get 409."""
        return self.sessions.conclude(secret)

    def snapshot(self, secret: str) -> Trace:
        """The live session's trace (the object being recorded into). Raises KeyError if the
        session is unknown or concluded."""
        session = self.sessions.lookup(secret)
        if session is None:
            raise KeyError("unknown session")
        return session.trace

    @property
    def session_count(self) -> int:
        return len(self.sessions)

    async def aclose(self, deadline: float | None = None) -> None:
        """Let in-flight turns finish recording (briefly: until the loop's time ``deadline``,
        by default :data:`GRACEFUL_SHUTDOWN_S` from now), then close the upstream client."""
        if self._tasks:
            loop = asyncio.get_running_loop()
            end = loop.time() + GRACEFUL_SHUTDOWN_S if deadline is None else deadline
            _, pending = await asyncio.wait(set(self._tasks), timeout=max(0.0, end - loop.time()))
            for task in pending:
                task.cancel()
        await self.forwarder.aclose()

    # -- routes -------------------------------------------------------------------------

    def _endpoint(self, dialect: Dialect) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            incoming = Incoming(request.receive, self.settings.body_timeout)
            session: Session | None = None
            try:
                session = authenticate(self.sessions, request)
                return await self._model_call(request, dialect, session, incoming)
            except RequestError as exc:
                if exc.client_input and session is not None:
                    note_refusal(session, exc.status, str(exc))
                return refused(dialect, exc, incoming)
            except ClientDisconnect:
                return Response(status_code=400)

        return endpoint

    async def _count_tokens(self, request: Request) -> Response:
        """Anthropic's ``count_tokens``: authenticated like a model call, but not one (see
        :mod:`vfray.interception.count_tokens`)."""
        incoming = Incoming(request.receive, self.settings.body_timeout)
        anthropic = DIALECTS["anthropic"]
        try:
            authenticate(self.sessions, request)
            raw = await incoming.read(request.headers.get("content-length"), self.max_body_bytes)
            body = parse_json(raw)
            if not isinstance(body.get("messages"), list):
                raise RequestError(400, "'messages' must be a list of messages")
            headers = {k: v for k, v in request.headers.items() if k.startswith("anthropic-")}
            return await self.token_counter.answer(body, headers)
        except RequestError as exc:
            return refused(anthropic, exc, incoming)
        except ClientDisconnect:
            return Response(status_code=400)

    async def _gemini_count_tokens(self, request: Request) -> Response:
        """Gemini's ``countTokens``: authenticated like a model call, but not one; answered
        with the estimate :mod:`~vfray.interception.count_tokens` gives when the upstream
        cannot count (no open server counts a Gemini request)."""
        incoming = Incoming(request.receive, self.settings.body_timeout)
        try:
            authenticate(self.sessions, request)
            raw = await incoming.read(request.headers.get("content-length"), self.max_body_bytes)
            try:
                counted = counted_fields(parse_json(raw))
            except DialectError as exc:
                raise RequestError(400, f"invalid gemini request: {exc}") from None
            return JSONResponse({"totalTokens": estimate(counted)})
        except RequestError as exc:
            return refused(self._gemini_dialect, exc, incoming)
        except ClientDisconnect:
            return Response(status_code=400)

    async def _models(self, request: Request) -> Response:
        # Both SDKs' shapes in one: OpenAI's model object and list, Anthropic's ModelInfo and
        # page fields (``type``, ``display_name``, ``created_at``; ``has_more``, ``*_id``).
        name = self.upstream.model
        model = {
            "id": name,
            "object": "model",
            "created": 0,
            "owned_by": "vfray",
            "type": "model",
            "display_name": name,
            "created_at": "1970-01-01T00:00:00Z",
        }
        page = {"object": "list", "data": [model], "has_more": False}
        return JSONResponse({**page, "first_id": name, "last_id": name})

    async def _health(self, request: Request) -> Response:
        # Liveness only: every box can reach this route, and how many rollouts are live is
        # none of a box's business (the host reads ``session_count`` directly).
        return JSONResponse({"status": "ok"})

    # -- one model call -----------------------------------------------------------------

    async def _model_call(
        self, request: Request, dialect: Dialect, session: Session, incoming: Incoming
    ) -> Response:
        raw = await incoming.read(request.headers.get("content-length"), self.max_body_bytes)
        # Only the interception's own top-level changes (the model, sampling, token-in's fields)
        # touch the body unless a stop hook, handed the request, may change it in place: then
        # no member's text is kept to forward, and none is walked for.
        kept_as_sent = session.stop_check is None
        body, client_json = parse_json_kept(raw, keep=kept_as_sent)
        try:
            parsed = dialect.parse_request(body, session.parsed)
        except DialectError as exc:
            message = f"invalid {dialect.name} request: {exc}"
            raise RequestError(400, message, client_input=True) from None
        except Exception as exc:  # anything else in a client's body is still the client's
            message = f"invalid {dialect.name} request: {type(exc).__name__}: {exc}"
            raise RequestError(400, message, client_input=True) from None
        # A reply the agent sends back with its tool-call arguments re-serialized (goose) is
        # the reply: its branch extends (and token-in finds it).
        parsed.messages = as_replied(session.trace, parsed.messages)

        digest = hashlib.sha256(raw).digest()
        same = session.same_call(digest, _is_retry(request), self.retry_window_s, raw, body)
        if same is not None:
            # A retry of a call in flight or just answered: join or replay it rather than
            # sample again, unless it failed (then the retry is a fresh attempt, as intended).
            await same.head()
            if same.ok:
                return await respond(same, self.settings.sse_keepalive)

        pending = PendingRequest(body if isinstance(body, dict) else None, parsed)
        token = PENDING_REQUEST.set(pending)
        body_token = PENDING_BODY.set(pending.body)
        try:
            why = await refusal(session)
        finally:
            PENDING_BODY.reset(body_token)
            PENDING_REQUEST.reset(token)
        if why is not None:
            raise RequestError(400, f"rollout stopped: {why}", final=True)

        sampling = self.upstream.sampling
        if session.sampling is not None:
            sampling = {**sampling, **session.sampling}
        exchange = Exchange(digest, parsed.stream, raw)
        session.remember(exchange, self.retry_window_s)
        turn = Turn(
            session=session,
            dialect=dialect,
            request=parsed,
            upstream_body=dialect.impose(body, self.upstream.model, sampling),
            client_wants_usage=dialect.client_wants_usage(body),
            client_headers={
                k: v
                for k, v in request.headers.items()
                if k in self.forward_headers or k.startswith("anthropic-")
            },
            model=self.upstream.model,
            api_key=self.upstream.api_key,
            policy_version=self.policy_version,
            require_tokens=sampling.get("return_tokens") == "required",
            client_json=client_json,
        )
        if self.token_in is not None and isinstance(body, dict):
            await send_as_tokens(self.token_in, turn, session, dialect, parsed, body)
        # Its own task: a client that hangs up mid-stream must not cancel the upstream call
        # or its recording (a retry will replay it).
        task = asyncio.create_task(run_turn(turn, self.forwarder, exchange))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        session.turns.add(task)
        task.add_done_callback(session.turns.discard)
        return await respond(exchange, self.settings.sse_keepalive)


class Interception:
    """``async with Interception(upstream) as icpt``: the app served on 127.0.0.1.

    ``icpt.url`` ends in ``/v1`` (OpenAI clients); ``icpt.root_url`` is the bare origin, which
    Anthropic clients take as their base URL. ``head_limits`` bounds each request's head (size,
    header count, read time); the rest of the options go to :class:`InterceptionApp`.
    """

    def __init__(
        self,
        upstream: Upstream,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        head_limits: HeadLimits | None = None,
        **app_options: Any,
    ) -> None:
        self.app = InterceptionApp(upstream, **app_options)
        self.host, self.port = host, port
        self.head_limits = head_limits
        self.root_url = ""
        self.url = ""
        self._serving: contextlib.AbstractAsyncContextManager[str] | None = None

    async def __aenter__(self) -> Interception:
        serving = _serve(self.app, self.host, self.port, self.head_limits)
        self.root_url = await serving.__aenter__()
        self._serving = serving
        self.url = f"{self.root_url}/v1"
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.app.closing = True
        # One grace period for both: the server waits for its requests, whose turns are the
        # in-flight ones; a turn still upstream when the server gave up is not waited for again
        # (a close with a call stuck upstream took 10 s, not 5).
        # Leaving with an error or a stop, nothing is waited for: the turns in flight belong
        # to rollouts that are gone (a stop re-runs them).
        grace = GRACEFUL_SHUTDOWN_S if exc_type is None else 0.0
        deadline = asyncio.get_running_loop().time() + grace
        try:
            if self._serving is not None:
                await self._serving.__aexit__(exc_type, exc, tb)
        finally:
            self._serving = None
            await self.app.aclose(deadline)


def _serve(
    app: InterceptionApp, host: str, port: int, head_limits: HeadLimits | None
) -> contextlib.AbstractAsyncContextManager[str]:
    @contextlib.asynccontextmanager
    async def serving() -> AsyncIterator[str]:
        # uvicorn's default keep-alive (5 s) would drop idle harness connections mid-rollout.
        async with serve_in_loop(
            app, host, port, head_limits=head_limits, timeout_keep_alive=600
        ) as url:
            yield url

    return serving()
