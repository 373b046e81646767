"""The interception's HTTP edge on real sockets: bounded request heads (size, header count, read
time), oversized bodies answered 413 rather than reset, and client input that is not valid
Unicode answered 400 and noted on the trace."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import uvicorn

from vfray.endpoints.serving import (
    GRACEFUL_SHUTDOWN_S,
    HeadLimits,
    close_abandoning,
    serve_in_loop,
    serve_in_thread,
)
from vfray.interception import Interception, InterceptionSettings, Upstream
from vfray.models.scripted.server import ScriptedModel, scripted_server
from vfray.trace import TaskRecord, Trace

ROUTE = "/v1/chat/completions"


@pytest.fixture
def model() -> Iterator[tuple[ScriptedModel, str]]:
    scripted = ScriptedModel("echo")
    with scripted_server(scripted) as url:
        yield scripted, url


@pytest.fixture
async def icpt(model: tuple[ScriptedModel, str]) -> AsyncIterator[Interception]:
    limits = HeadLimits(timeout=0.5)
    async with Interception(
        Upstream(model[1], model="m"), head_limits=limits, max_body_bytes=1_000_000
    ) as i:
        yield i


def port(icpt: Interception) -> int:
    return int(icpt.root_url.rsplit(":", 1)[1])


async def raw_exchange(icpt: Interception, data: bytes, wait: float = 20.0) -> bytes:
    """Send ``data`` on a fresh connection, then everything the server sends until it closes.
    ``wait`` only bounds a hang: the server is expected to close on its own."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port(icpt))
    try:
        writer.write(data)
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        return await asyncio.wait_for(reader.read(), wait)
    finally:
        writer.close()


def status_of(response: bytes) -> int:
    assert response.startswith(b"HTTP/1.1 "), response[:200]
    return int(response.split(b" ", 2)[1])


def head(secret: str = "x", extra: bytes = b"", target: bytes = ROUTE.encode()) -> bytes:
    return (
        b"POST " + target + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Authorization: Bearer " + secret.encode() + b"\r\n" + extra
    )


def new_trace() -> Trace:
    return Trace(task=TaskRecord(key="k", hash="h"))


# -- request heads ------------------------------------------------------------------------------


async def test_oversized_heads_are_refused_with_431(icpt: Interception) -> None:
    huge_value = head(extra=b"X-Big: " + b"a" * 1_000_000 + b"\r\n\r\n")
    many = head(extra=b"".join(b"X-H%d: v\r\n" % i for i in range(20_000)) + b"\r\n")
    long_target = head(target=b"/v1/" + b"a" * 1_000_000) + b"\r\n"
    for request in (huge_value, many, long_target):
        response = await raw_exchange(icpt, request)
        assert status_of(response) == 431
        assert b"connection: close" in response.lower()
    # The server is still serving.
    async with httpx.AsyncClient() as http:
        assert (await http.get(f"{icpt.root_url}/health")).status_code == 200


async def test_half_sent_heads_are_dropped_after_the_head_timeout(icpt: Interception) -> None:
    stalled = [head()[: 20 + i] for i in range(40)]  # cut anywhere in the head

    async def trickle() -> bytes:
        # Slowloris: a header line every 0.2 s never finishes the head within 0.5 s.
        reader, writer = await asyncio.open_connection("127.0.0.1", port(icpt))
        try:
            writer.write(head())
            for i in range(100):
                try:
                    first = await asyncio.wait_for(reader.read(1), 0.2)
                except TimeoutError:
                    writer.write(b"X-Slow-%d: v\r\n" % i)
                    continue
                return first + await asyncio.wait_for(reader.read(), 20)
            return b""
        finally:
            writer.close()

    responses = await asyncio.gather(*(raw_exchange(icpt, s) for s in stalled), trickle())
    assert [status_of(r) for r in responses] == [408] * (len(stalled) + 1)


async def test_normal_requests_big_bodies_and_idle_keepalive_still_work(
    icpt: Interception, model: tuple[ScriptedModel, str]
) -> None:
    trace = new_trace()
    secret = icpt.app.register(trace)
    headers = {
        "authorization": f"Bearer {secret}",
        **{f"x-extra-{i}": "v" * 100 for i in range(60)},
    }
    prompt = "word " * 190_000  # ~950 kB, just under the 1 MB body cap
    async with httpx.AsyncClient(base_url=icpt.url, timeout=60) as http:
        first = await http.post(
            "/chat/completions",
            json={"messages": [{"role": "user", "content": prompt}]},
            headers=headers,
        )
        assert first.status_code == 200, first.text
        await asyncio.sleep(1.0)  # idle past the head timeout: keep-alive rules, not the head's
        second = await http.post(
            "/chat/completions",
            json={"messages": [{"role": "user", "content": "again"}]},
            headers=headers,
        )
        assert second.status_code == 200, second.text
    assert len(trace.calls) == 2 and trace.calls[0].request_ids
    assert len(model[0].history) == 2


# -- bodies -------------------------------------------------------------------------------------


def _urllib_post(url: str, secret: str, body: bytes) -> tuple[int, dict[str, Any]]:
    """POST the way urllib does (whole body first, ``Connection: close``): status and JSON."""
    request = urllib.request.Request(
        url, data=body, headers={"Authorization": f"Bearer {secret}"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


async def test_oversized_body_is_answered_413_not_reset(
    icpt: Interception, model: tuple[ScriptedModel, str]
) -> None:
    trace = new_trace()
    secret = icpt.app.register(trace)
    big = json.dumps({"messages": [{"role": "user", "content": "x" * 5_000_000}]}).encode()
    status, body = await asyncio.to_thread(
        _urllib_post, icpt.url + "/chat/completions", secret, big
    )
    assert status == 413
    assert "exceeds the 1000000-byte limit" in body["error"]["message"]

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(40):  # no Content-Length: caught while streaming in
            yield b" " * 100_000

    async with httpx.AsyncClient(base_url=icpt.url, timeout=60) as http:
        auth = {"authorization": f"Bearer {secret}"}
        streamed = await http.post("/chat/completions", content=chunks(), headers=auth)
        assert streamed.status_code == 413
        # The connection was drained, not poisoned: the next call on it works.
        ok = await http.post(
            "/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}]},
            headers=auth,
        )
        assert ok.status_code == 200
    # A wrong key on a big body is answered too (the body is not read before the 401).
    status, _ = await asyncio.to_thread(_urllib_post, icpt.url + "/chat/completions", "bad", big)
    assert status == 401
    assert len(model[0].history) == 1 and len(trace.calls) == 1
    refusals = [n for n in trace.notes if "refused a call as bad input: HTTP 413" in n]
    assert len(refusals) == 2


# -- client JSON --------------------------------------------------------------------------------


async def test_lone_surrogate_is_client_input_400_and_noted(
    icpt: Interception, model: tuple[ScriptedModel, str]
) -> None:
    trace = new_trace()
    secret = icpt.app.register(trace)
    auth = {"authorization": f"Bearer {secret}", "content-type": "application/json"}
    async with httpx.AsyncClient(base_url=icpt.url) as http:
        for raw in (
            rb'{"messages": [{"role": "user", "content": "\ud800"}]}',
            rb'{"messages": [{"role": "user", "content": "ok"}], "stop": ["\udfff x"]}',
            rb'{"messages": [{"role": "user", "content": "a\uDBFFb"}]}',
        ):
            response = await http.post("/chat/completions", content=raw, headers=auth)
            assert response.status_code == 400, response.text
            assert "lone UTF-16 surrogate" in response.json()["error"]["message"]
        # A proper pair (an escaped emoji) and an escaped backslash before "ud800" are fine.
        for raw in (
            rb'{"messages": [{"role": "user", "content": "\ud83d\ude00"}]}',
            rb'{"messages": [{"role": "user", "content": "\\ud800"}]}',
        ):
            response = await http.post("/chat/completions", content=raw, headers=auth)
            assert response.status_code == 200, response.text
    users = [m.text for branch in trace.branches for m in branch if m.role == "user"]
    assert users == ["\U0001f600", "\\ud800"]
    assert len(model[0].history) == 2 and len(trace.calls) == 2
    assert all(call.error is None for call in trace.calls)
    assert sum("lone UTF-16 surrogate" in note for note in trace.notes) == 3


# -- the shared upstream client -----------------------------------------------------------------


async def test_a_cookie_set_for_one_rollout_never_reaches_another() -> None:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from vfray.endpoints.serving import serve_in_loop

    seen: list[str | None] = []

    async def complete(request: Request) -> JSONResponse:
        seen.append(request.headers.get("cookie"))
        reply = {"choices": [{"message": {"role": "assistant", "content": "ok"}}]}
        response = JSONResponse(reply)
        response.set_cookie("affinity", f"rollout-{len(seen)}")
        return response

    model = Starlette(routes=[Route("/v1/chat/completions", complete, methods=["POST"])])
    async with serve_in_loop(model) as url:
        # A host name, not an IP: aiohttp's default jar keeps cookies only for names.
        upstream = Upstream(url.replace("127.0.0.1", "localhost") + "/v1", model="m")
        async with Interception(upstream) as icpt, httpx.AsyncClient(base_url=icpt.url) as http:
            body = {"messages": [{"role": "user", "content": "hi"}]}
            for _ in range(3):
                secret = icpt.app.register(new_trace())
                auth = {"authorization": f"Bearer {secret}"}
                assert (await http.post("/chat/completions", json=body, headers=auth)).is_success
    assert seen == [None, None, None]


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2)")
async def test_the_listen_queue_is_as_deep_as_the_kernel_allows(icpt: Interception) -> None:
    # For a listening socket `ss` reports its backlog as Send-Q. uvicorn used to re-listen with
    # its default 2048, so a burst of 5,000 harness connects overflowed into SYN retransmits.
    somaxconn = int(Path("/proc/sys/net/core/somaxconn").read_text())
    listing = subprocess.run(
        ["ss", "-ltnH", f"sport = :{port(icpt)}"], capture_output=True, text=True, check=True
    ).stdout.split()
    assert int(listing[2]) == min(8192, somaxconn)


# -- a client that hangs up ---------------------------------------------------------------------


async def test_a_client_hanging_up_mid_stream_ends_its_answer_not_the_call() -> None:
    """The answer to a client that hangs up mid-stream ends at once, not when the model next
    speaks; the upstream call goes on and is recorded."""
    with scripted_server("echo", stall=2.0) as url:  # silent for 2 s after the first event
        settings = InterceptionSettings(sse_keepalive=0)  # nothing to send meanwhile
        async with Interception(Upstream(url, model="m"), settings=settings) as icpt:
            trace = new_trace()
            secret = icpt.app.register(trace).encode()
            body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "stream": True})
            reader, writer = await asyncio.open_connection("127.0.0.1", port(icpt))
            writer.write(
                b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer "
                + secret
                + b"\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                % (len(body), body.encode())
            )
            head = await asyncio.wait_for(reader.readuntil(b"data: "), 10)
            assert head.startswith(b"HTTP/1.1 200")
            writer.close()

            def answering() -> list[asyncio.Task[Any]]:
                return [t for t in asyncio.all_tasks() if "run_asgi" in repr(t.get_coro())]

            for _ in range(50):
                if not answering():
                    break
                await asyncio.sleep(0.02)
            assert not answering() and not trace.calls  # gone while the model is still silent
            for _ in range(200):
                if trace.calls:
                    break
                await asyncio.sleep(0.05)
    assert len(trace.calls) == 1 and trace.calls[0].error is None and trace.calls[0].streamed


# -- shutdown -----------------------------------------------------------------------------------


async def test_a_request_still_waiting_at_shutdown_gets_503_and_no_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """uvicorn cancels the handlers still waiting when its graceful shutdown ends: the agent
    gets a 503 and the log holds no "Exception in ASGI application" traceback. The close
    takes one grace period: the call's turn, still upstream, is not waited for a second one."""
    slow = ScriptedModel("echo", latency=30)
    with scripted_server(slow) as url:
        async with Interception(Upstream(url, model="m")) as icpt:
            secret = icpt.app.register(new_trace())
            headers = {"authorization": f"Bearer {secret}"}
            body = {"messages": [{"role": "user", "content": "hi"}]}
            http = httpx.AsyncClient(base_url=icpt.url, timeout=60)
            call = http.post("/chat/completions", json=body, headers=headers)
            waiting = asyncio.create_task(call)
            await asyncio.sleep(1.0)  # the call is upstream, which takes 30 s
            closing = time.monotonic()
        closed = time.monotonic() - closing
        answer = await waiting
        await http.aclose()
    assert answer.status_code == 503
    assert "shutting down" in answer.text
    assert "Exception in ASGI application" not in caplog.text
    # A bound, not a speed: two grace periods one after the other took 10.1 s.
    assert GRACEFUL_SHUTDOWN_S <= closed < 2 * GRACEFUL_SHUTDOWN_S - 1, closed


async def test_a_call_at_the_model_when_its_rollout_concludes_is_hung_up_upstream() -> None:
    """A rollout that ends with a call still at the model (its agent timed out, or was
    stopped): the interception closes that upstream connection, so the endpoint (vLLM aborts
    a request whose client went away) stops generating an answer no one reads; before, the
    call went on for up to ``upstream_timeout`` (1800 s). The agent, if still there, gets a
    503, and nothing is recorded on the handed-over trace. The upstream here is a plain socket
    that reads the request and never answers."""
    asked, hung_up = asyncio.Event(), asyncio.Event()

    async def silent_model(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        asked.set()
        while await reader.read(65536):
            pass
        hung_up.set()
        writer.close()

    server = await asyncio.start_server(silent_model, "127.0.0.1", 0)
    upstream = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
    async with server, Interception(Upstream(upstream, model="m")) as icpt:
        trace = new_trace()
        secret = icpt.app.register(trace)
        async with httpx.AsyncClient(base_url=icpt.url, timeout=60) as http:
            body = {"messages": [{"role": "user", "content": "hi"}]}
            headers = {"authorization": f"Bearer {secret}"}
            call = http.post("/chat/completions", json=body, headers=headers)
            waiting = asyncio.create_task(call)
            await asyncio.wait_for(asked.wait(), 30)
            assert icpt.app.conclude(secret) is trace
            # A bound on a hang, not a speed: the old interception never hung up.
            await asyncio.wait_for(hung_up.wait(), 30)
            answer = await asyncio.wait_for(waiting, 30)
    assert answer.status_code == 503, answer.text
    assert trace.calls == []


async def test_a_server_closed_for_a_stop_cancels_its_requests_instead_of_waiting() -> None:
    """``close_abandoning`` (a SandboxHost or the model actor shutting down under cancelled
    rollouts): the request still at the model, which would answer within the 5 s grace
    period, is cancelled and answered 503 at once. Closed the ordinary way, the same request
    is waited for and answered 200."""
    answers = []
    for abandon in (True, False):
        stack = contextlib.AsyncExitStack()
        url = await stack.enter_async_context(serve_in_loop(ScriptedModel("echo", latency=2)))
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            waiting = asyncio.create_task(http.post("/v1/chat/completions", json=body))
            await asyncio.sleep(0.5)  # at the model, which answers after 2 s
            await (close_abandoning(stack) if abandon else stack.aclose())
            answers.append((await waiting).status_code)
    assert answers == [503, 200]


def test_a_request_in_flight_when_its_loop_is_closed_gets_503_and_no_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A training coroutine that returns while a server on its loop still has a request in
    flight (a plain ``with vf.Farm`` left inside ``asyncio.run``): ``asyncio.run`` cancels the
    handler, and the client gets a 503 instead of the log getting a traceback."""
    from concurrent.futures import ThreadPoolExecutor

    from vfray.endpoints.serving import serve_in_loop

    slow = ScriptedModel("echo", latency=30)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}

    async def main(pool: ThreadPoolExecutor) -> Any:
        serving = serve_in_loop(slow)
        url = await serving.__aenter__()  # never left: the loop's closing cancels the server
        answer = pool.submit(httpx.post, f"{url}/v1/chat/completions", json=body, timeout=60)
        await asyncio.sleep(1.0)  # the handler is sleeping in the model's latency
        return answer

    with ThreadPoolExecutor(1) as pool:
        answer = asyncio.run(main(pool)).result(timeout=30)
    assert answer.status_code == 503
    assert "shutting down" in answer.text
    assert "Exception in ASGI application" not in caplog.text


async def _hello(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"hi"})


async def test_an_idle_server_ticks_once_a_second_and_a_close_wakes_it_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """uvicorn's own loop wakes ten times a second to look for ``should_exit``: the idle CPU
    of every server vfray runs. Its ticks here are one a second, its date header still made
    on each, and a close (``should_exit``, set from the server's loop or another thread) ends
    it at once, not at its next tick."""
    ticks: list[int] = []
    on_tick = uvicorn.Server.on_tick

    async def counted(self: uvicorn.Server, counter: int) -> bool:
        ticks.append(counter)
        return await on_tick(self, counter)

    async def just_ticked() -> None:
        seen = len(ticks)
        while len(ticks) == seen:
            await asyncio.sleep(0.01)

    monkeypatch.setattr(uvicorn.Server, "on_tick", counted)
    async with serve_in_loop(_hello) as url:
        async with httpx.AsyncClient() as client:
            response = await client.get(url)
            assert response.status_code == 200 and response.headers["date"]
        await asyncio.sleep(1.6)
        assert 2 <= len(ticks) <= 3 and all(c % 10 == 0 for c in ticks), ticks
        await just_ticked()  # the next tick is a second away: only a wake ends it sooner
        closed_at = time.monotonic()
    assert time.monotonic() - closed_at < 0.7
    with serve_in_thread(_hello):
        await just_ticked()
        await just_ticked()
        closed_at = time.monotonic()
    assert time.monotonic() - closed_at < 0.7


LINE_BREAKS = "one\u2028two\u2029three\x85four"
"""Characters ``str.splitlines`` breaks at that JSON may hold unescaped (vLLM's pydantic
serializer and Node's JSON.stringify leave them raw); none ends an SSE line."""


async def record_stream(writes: list[bytes], pause: float = 0.0) -> tuple[str, Trace]:
    """One streamed chat call through the interception to an upstream that writes ``writes``
    as they are (``pause`` seconds apart: each its own read); what the client said it got
    (the OpenAI SDK's text), and the trace."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    async def send() -> AsyncIterator[bytes]:
        for data in writes:
            yield data
            await asyncio.sleep(pause)

    async def complete(request: Request) -> StreamingResponse:
        return StreamingResponse(send(), media_type="text/event-stream")

    model = Starlette(routes=[Route("/v1/chat/completions", complete, methods=["POST"])])
    async with serve_in_loop(model) as url, Interception(Upstream(f"{url}/v1", model="m")) as icpt:
        trace = new_trace()
        client = openai.AsyncOpenAI(base_url=icpt.url, api_key=icpt.app.register(trace))
        stream = await client.chat.completions.create(
            model="x", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        said = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    return said, trace


def chunk(delta: dict[str, Any], token_ids: list[int] | None = None, ascii: bool = True) -> str:
    choice: dict[str, Any] = {"index": 0, "delta": delta}
    if token_ids is not None:
        choice["token_ids"] = token_ids
    return json.dumps({"choices": [choice]}, ensure_ascii=ascii)


STOP = json.dumps({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})


async def test_a_streamed_reply_keeps_unescaped_line_separators_in_its_json() -> None:
    """A model's stream whose JSON carries U+2028, U+2029 and U+0085 unescaped, as vLLM sends
    it: the trace records the whole reply and its token ids (the old parser split the event's
    data at them and dropped the event from the trace, while the agent still got it)."""
    pieces = ["Hello ", LINE_BREAKS, "!"]
    events = [chunk({"content": p}, [i], ascii=False) for i, p in enumerate(pieces)]
    wire = "".join(f"data: {e}\n\n" for e in [*events, STOP, "[DONE]"]).encode()
    said, trace = await record_stream([wire])
    assert said == "".join(pieces)
    [call] = trace.calls
    assert call.error is None and call.completion_token_ids == [0, 1, 2]
    assert trace.graph[call.response_id].content == "".join(pieces)


async def test_a_crlf_stream_cut_between_cr_and_lf_keeps_every_event() -> None:
    """sse-starlette ends SSE lines with CRLF, and a large event spans several reads: a read
    that ends between an event's CR and LF once kept the halves apart, so no event ended and
    the whole reply was lost from the trace (its text and token ids) while the client got it.
    Every write here ends on such a CR."""
    pieces = ["Hello", " there", ", agent", "!"]
    events = [chunk({"content": p}, [i]) for i, p in enumerate(pieces)]
    wire = "".join(f"data: {e}\r\n\r\n" for e in [*events, STOP, "[DONE]"]).encode()
    cuts = [i + 1 for i in range(len(wire)) if wire[i : i + 1] == b"\r"]
    writes = [wire[a:b] for a, b in zip([0, *cuts], [*cuts, len(wire)], strict=True)]
    said, trace = await record_stream(writes, pause=0.005)
    assert said == "".join(pieces)
    [call] = trace.calls
    assert call.error is None and call.completion_token_ids == [0, 1, 2, 3]
    assert trace.graph[call.response_id].content == "".join(pieces)


async def test_tool_calls_streamed_without_an_index_stay_apart() -> None:
    """Gemini's OpenAI-compatible stream sends ``tool_calls`` parts with no ``index``: each
    call whole with an id of its own, or its arguments split over parts without one. They
    were all recorded as call 0, their arguments run together (``{...}{...}``)."""
    calls = [
        {"id": "call_a", "type": "function", "function": {"name": "glob", "arguments": ""}},
        {"function": {"arguments": '{"pattern": '}},
        {"function": {"arguments": '"*.py"}'}},
        {"id": "call_b", "type": "function", "function": {"name": "read", "arguments": "{}"}},
    ]
    events = [chunk({"role": "assistant", "tool_calls": [part]}) for part in calls]
    done = json.dumps({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    wire = "".join(f"data: {e}\n\n" for e in [*events, done, "[DONE]"]).encode()
    _, trace = await record_stream([wire])
    [call] = trace.calls
    reply = trace.graph[call.response_id]
    got = [
        (c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]))
        for c in reply.tool_calls or []
    ]
    assert got == [("call_a", "glob", {"pattern": "*.py"}), ("call_b", "read", {})]


def test_sse_blocks_split_at_line_feeds_only() -> None:
    from vfray.interception.dialects.base import parse_sse_block

    raw = f'data: {{"a": "{LINE_BREAKS}"}}\n\n'.encode()
    assert json.loads(parse_sse_block(raw).data) == {"a": LINE_BREAKS}
    several = f"event: e\ndata: {LINE_BREAKS}\ndata: x\n\n".encode()
    assert (parse_sse_block(several).event, parse_sse_block(several).data) == (
        "e",
        f"{LINE_BREAKS}\nx",
    )
    assert parse_sse_block(b"event: e\rdata: x\n\n").data == "x"  # a lone CR ends a line too
    assert parse_sse_block(b": keepalive\n\n").data == ""


async def test_a_reply_with_utf16_surrogates_is_recorded_with_a_note() -> None:
    """An emoji split between two events as JSON escapes (``"\\ud83d"``, ``"\\ude00"``) and a
    lone half: the call is on the trace, the pair joined into its character, the lone half
    U+FFFD, said in a note; it writes to Parquet. It was dropped from the trace without an
    error (its content address could not be computed), while the agent got the reply."""
    from vfray.traces.convert import table_to_traces, traces_to_table

    events = [
        chunk({"content": "emoji "}, [0]),
        '{"choices": [{"index": 0, "delta": {"content": "\\ud83d"}, "token_ids": [1]}]}',
        '{"choices": [{"index": 0, "delta": {"content": "\\ude00 and "}, "token_ids": [2]}]}',
        '{"choices": [{"index": 0, "delta": {"content": "\\ud800!"}, "token_ids": [3]}]}',
    ]
    wire = "".join(f"data: {e}\n\n" for e in [*events, STOP, "[DONE]"]).encode()
    said, trace = await record_stream([wire])
    assert said == "emoji \ud83d\ude00 and \ud800!"  # the SDK's own decoding of the bytes
    [call] = trace.calls
    assert call.error is None and call.completion_token_ids == [0, 1, 2, 3]
    assert trace.graph[call.response_id].content == "emoji \U0001f600 and \ufffd!"
    assert any("surrogates" in n and "1 lone one(s)" in n for n in trace.notes), trace.notes
    [back] = table_to_traces(traces_to_table([trace]))
    assert back.graph[call.response_id].content == "emoji \U0001f600 and \ufffd!"


async def test_a_stream_of_two_choices_records_choice_0() -> None:
    """With ``n=2`` the stream interleaves the choices' chunks, each by its index: the trace
    records choice 0, its text and token ids, as a non-streamed call records choices[0]
    (the two were run together into one reply)."""
    events = []
    for i, (first, second) in enumerate([("Hel", "Oth"), ("lo", "er")]):
        events.append(
            json.dumps({"choices": [{"index": 0, "delta": {"content": first}, "token_ids": [i]}]})
        )
        events.append(
            json.dumps(
                {"choices": [{"index": 1, "delta": {"content": second}, "token_ids": [10 + i]}]}
            )
        )
    wire = "".join(f"data: {e}\n\n" for e in [*events, STOP, "[DONE]"]).encode()
    _, trace = await record_stream([wire])
    [call] = trace.calls
    assert trace.graph[call.response_id].content == "Hello"
    assert call.completion_token_ids == [0, 1]


async def test_a_custom_tool_call_is_recorded_whole_and_continues_its_branch() -> None:
    """GPT-5's custom tools: a call carries free text in ``custom.input``, not JSON
    ``function.arguments``. Streamed in pieces, it is recorded whole; sent back in the next
    request, it is the same message, so the call extends the branch. It was made a function
    call with no name and ``{}`` for arguments, its input lost."""
    patch = "*** Begin Patch\n*** Add File: a.txt\n+hi\n*** End Patch"
    parts = [
        {
            "index": 0,
            "id": "call_p",
            "type": "custom",
            "custom": {"name": "apply_patch", "input": ""},
        },
        {"index": 0, "custom": {"input": patch[:20]}},
        {"index": 0, "custom": {"input": patch[20:]}},
    ]
    events = [chunk({"role": "assistant", "tool_calls": [p]}) for p in parts]
    wire = "".join(f"data: {e}\n\n" for e in [*events, STOP, "[DONE]"]).encode()
    _, trace = await record_stream([wire])
    [call] = trace.calls
    sent = {"id": "call_p", "type": "custom", "custom": {"name": "apply_patch", "input": patch}}
    assert trace.graph[call.response_id].tool_calls == [sent]
    # The client sends the reply back with the tool's output: the same message, one branch.
    from vfray.interception.dialects import DIALECTS

    reply = {"role": "assistant", "content": None, "tool_calls": [sent]}
    body = {"messages": [{"role": "user", "content": "hi"}, reply]}
    again = DIALECTS["chat"].parse_request(body).messages
    assert [m.id for m in again] == trace.branch_list[0].message_ids


def test_responses_custom_tool_calls_fold_into_chat_form() -> None:
    """Codex's apply_patch with GPT-5 is a custom tool: a ``custom_tool_call`` output item
    and, sent back, a ``custom_tool_call_output`` input item. They fold into the assistant's
    tool call and a tool message, as function calls do (they were kept whole as messages of
    role "custom_tool_call"), and the reply sent back as input keeps its content id."""
    from vfray.interception.dialects import DIALECTS

    responses = DIALECTS["responses"]
    call = {
        "type": "custom_tool_call",
        "call_id": "c1",
        "name": "apply_patch",
        "input": "*** Begin",
    }
    reply = responses.parse_response({"output": [{"id": "ct_1", "status": "completed", **call}]})
    assert reply.message is not None
    want = {"id": "c1", "type": "custom", "custom": {"name": "apply_patch", "input": "*** Begin"}}
    assert reply.message.role == "assistant" and reply.message.tool_calls == [want]
    request = responses.parse_request(
        {
            "input": [
                {"role": "user", "content": "edit"},
                call,
                {"type": "custom_tool_call_output", "call_id": "c1", "output": "Done!"},
            ]
        }
    )
    _user, assistant, tool = request.messages
    assert assistant.id == reply.message.id
    assert (tool.role, tool.tool_call_id, tool.content) == ("tool", "c1", "Done!")
