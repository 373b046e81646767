"""The interception proxy end to end: real openai/anthropic SDKs -> proxy -> scripted model."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from vfray.interception import Interception, InterceptionSettings, Limits, Upstream
from vfray.models.scripted.server import ScriptedModel, scripted_server
from vfray.scoring import PENDING_BODY
from vfray.trace import StopCondition, TaskRecord, Trace

MODEL = "imposed-model"
SAMPLING = {"temperature": 0.25, "top_p": 0.9}


def new_trace() -> Trace:
    return Trace(task=TaskRecord(key="k", hash="h"))


@pytest.fixture(scope="module")
def echo_url() -> Iterator[str]:
    with scripted_server("echo") as url:
        yield url


@pytest.fixture
def model() -> Iterator[tuple[ScriptedModel, str]]:
    scripted = ScriptedModel("echo")
    with scripted_server(scripted) as url:
        yield scripted, url


@pytest.fixture
async def icpt(echo_url: str) -> AsyncIterator[Interception]:
    async with Interception(
        Upstream(echo_url, "upstream-key", model=MODEL, sampling=SAMPLING)
    ) as i:
        yield i


def oai(icpt: Interception, secret: str, retries: int = 0) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=icpt.url, api_key=secret, max_retries=retries)


def anth(icpt: Interception, secret: str) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=icpt.root_url, api_key=secret, max_retries=0)


USER: Any = {"role": "user", "content": "hello there"}


# -- the three dialects, streaming and not ----------------------------------------------------


async def test_chat_records_one_call_per_turn_on_one_branch(icpt: Interception) -> None:
    trace = new_trace()
    client = oai(icpt, icpt.app.register(trace))
    system: Any = {"role": "system", "content": "be brief"}
    first = await client.chat.completions.create(model="other", messages=[system, USER])
    assert first.choices[0].message.content == "hello there"
    assert first.model == MODEL
    history = [system, USER, {"role": "assistant", "content": "hello there"}]
    history.append({"role": "user", "content": "again"})
    stream = await client.chat.completions.create(model="other", messages=history, stream=True)
    chunks = [chunk async for chunk in stream]
    # vfray asked upstream for a usage chunk; the client did not, so it never sees one.
    assert all(chunk.choices for chunk in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "again"

    assert len(trace.calls) == 2
    first_call, second_call = trace.calls
    assert (first_call.dialect, first_call.model, first_call.streamed) == ("chat", MODEL, False)
    assert first_call.sampling == SAMPLING
    assert first_call.finish_reason == "stop"
    assert first_call.usage.output_tokens > 0 and first_call.usage.input_tokens > 0
    assert second_call.streamed and second_call.usage.output_tokens > 0
    assert len(trace.branch_list) == 1  # the second turn extended the first
    texts = [m.text for m in trace.messages]
    assert texts == ["be brief", "hello there", "hello there", "again", "again"]
    assert trace.messages[-1].role == "assistant" and trace.last_reply == "again"


async def test_responses_dialect(icpt: Interception) -> None:
    trace = new_trace()
    client = oai(icpt, icpt.app.register(trace))
    reply = await client.responses.create(model="x", input="say hi", instructions="sys")
    assert reply.output_text == "say hi"
    stream = await client.responses.create(model="x", input="streamed hi", stream=True)
    events = [event async for event in stream]
    assert events[-1].type == "response.completed"
    assert [c.streamed for c in trace.calls] == [False, True]
    assert all(c.dialect == "responses" and c.finish_reason == "stop" for c in trace.calls)
    assert trace.graph[trace.calls[0].request_ids[0]].content == "sys"
    assert trace.last_reply == "streamed hi"
    assert trace.calls[1].usage.output_tokens > 0


async def test_anthropic_dialect(icpt: Interception) -> None:
    trace = new_trace()
    client = anth(icpt, icpt.app.register(trace))
    reply = await client.messages.create(
        model="x", max_tokens=100, system="sys", messages=[{"role": "user", "content": "hi anth"}]
    )
    assert reply.content[0].type == "text" and reply.content[0].text == "hi anth"
    async with client.messages.stream(
        model="x", max_tokens=100, messages=[{"role": "user", "content": "streamed"}]
    ) as stream:
        assert await stream.get_final_text() == "streamed"
    assert [c.streamed for c in trace.calls] == [False, True]
    assert all(c.dialect == "anthropic" and c.model == MODEL for c in trace.calls)
    assert trace.calls[0].sampling == {"max_tokens": 100, **SAMPLING}
    assert trace.calls[1].usage.output_tokens > 0


async def test_tool_calls_are_normalized_and_extend_the_branch() -> None:
    with scripted_server("bash") as url:
        async with Interception(Upstream(url, model=MODEL)) as icpt:
            trace = new_trace()
            client = oai(icpt, icpt.app.register(trace))
            tools: Any = [
                {
                    "type": "function",
                    "function": {
                        "name": "bash",
                        "parameters": {"type": "object", "properties": {"command": {}}},
                    },
                }
            ]
            messages: list[Any] = [{"role": "user", "content": "Run `echo hi` please"}]
            first = await client.chat.completions.create(
                model="x", messages=messages, tools=tools, stream=True
            )
            assert isinstance(first, openai.AsyncStream)
            chunks = [c async for c in first]
            deltas = [c.choices[0].delta.tool_calls for c in chunks if c.choices]
            call_id = next(calls[0].id for calls in deltas if calls and calls[0].id)
            recorded = trace.graph[trace.calls[0].response_id or ""]
            assert trace.calls[0].finish_reason == "tool_calls"
            assert recorded.tool_calls and recorded.tool_calls[0]["id"] == call_id
            arguments = recorded.tool_calls[0]["function"]["arguments"]
            messages.append(
                {"role": "assistant", "content": None, "tool_calls": recorded.tool_calls}
            )
            messages.append({"role": "tool", "tool_call_id": call_id, "content": "hi"})
            await client.chat.completions.create(model="x", messages=messages, tools=tools)
            assert json.loads(arguments)["command"] == "echo hi"
            assert trace.calls[1].tools == tools
            assert len(trace.branch_list) == 1 and len(trace.messages) == 4


# -- auth and malformed input -------------------------------------------------------------------


async def test_auth_and_input_errors(echo_url: str) -> None:
    upstream = Upstream(echo_url, model=MODEL)
    async with Interception(upstream, max_body_bytes=2000) as icpt:
        trace = new_trace()
        secret = icpt.app.register(trace)
        with pytest.raises(openai.AuthenticationError):
            await oai(icpt, "not-a-secret").chat.completions.create(model="x", messages=[USER])
        # Claude Code retries a 401 for as long as it runs: the Anthropic dialect says 403.
        with pytest.raises(anthropic.PermissionDeniedError):
            await anth(icpt, secret[:-1] + ("1" if secret[-1] == "0" else "0")).messages.create(
                model="x", max_tokens=5, messages=[USER]
            )
        async with httpx.AsyncClient(base_url=icpt.url) as http:
            auth = {"authorization": f"Bearer {secret}"}
            missing = await http.post("/chat/completions", json={"messages": [USER]})
            assert missing.status_code == 401
            bad_json = await http.post("/chat/completions", content=b"{nope", headers=auth)
            assert bad_json.status_code == 400
            assert "malformed JSON" in bad_json.json()["error"]["message"]
            wrong_dialect = await http.post("/messages", json={"input": "hi"}, headers=auth)
            assert wrong_dialect.status_code == 400
            assert wrong_dialect.json()["type"] == "error"  # anthropic error shape
            assert "'messages' must be a list" in wrong_dialect.json()["error"]["message"]
            not_object = await http.post("/responses", json=[1, 2], headers=auth)
            assert not_object.status_code == 400
            big = {"messages": [{"role": "user", "content": "x" * 5000}]}
            assert (await http.post("/chat/completions", json=big, headers=auth)).status_code == 413

            async def chunked() -> AsyncIterator[bytes]:
                for _ in range(10):
                    yield b" " * 500  # no Content-Length: the streamed size is what counts

            too_long = await http.post("/chat/completions", content=chunked(), headers=auth)
            assert too_long.status_code == 413
            models = await http.get("/models")
            assert models.json()["data"][0]["id"] == MODEL
            assert (await http.get(f"{icpt.root_url}/health")).json()["status"] == "ok"
        assert trace.calls == []

        await oai(icpt, secret).chat.completions.create(model="x", messages=[USER])
        assert icpt.app.conclude(secret) is trace
        with pytest.raises(openai.AuthenticationError, match="this rollout has concluded"):
            await oai(icpt, secret).chat.completions.create(model="x", messages=[USER])
        assert len(trace.calls) == 1 and icpt.app.session_count == 0
        assert secret not in trace.model_dump_json()


# -- limits -------------------------------------------------------------------------------------


def _conversation(turn: int) -> list[Any]:
    messages: list[Any] = []
    for i in range(turn + 1):
        messages.append({"role": "user", "content": f"turn {i} " + "word " * (3 * i + 1)})
        if i < turn:
            messages.append({"role": "assistant", "content": messages[-1]["content"]})
    return messages


async def _metric_after_first_call(icpt: Interception, limit: str) -> int:
    trace = new_trace()
    client = oai(icpt, icpt.app.register(trace))
    await client.chat.completions.create(model="x", messages=_conversation(0))
    usage = trace.calls[0].usage
    return {
        "max_input_tokens": usage.input_tokens,
        "max_output_tokens": usage.output_tokens,
        "max_total_tokens": usage.total_tokens,
    }[limit]


@pytest.mark.parametrize(
    "limit", ["max_turns", "max_input_tokens", "max_output_tokens", "max_total_tokens"]
)
async def test_limit_refuses_the_call_after_the_crossing_one(
    icpt: Interception, limit: str
) -> None:
    # Token caps are soft by one turn: call 2 crosses the cap and completes; call 3 is refused.
    value = 2 if limit == "max_turns" else await _metric_after_first_call(icpt, limit) + 1
    trace = new_trace()
    client = oai(icpt, icpt.app.register(trace, Limits(**{limit: value})), retries=3)
    for turn in range(2):
        await client.chat.completions.create(model="x", messages=_conversation(turn))
    # 401: what mini-swe-agent (litellm) gives up on at once (it retries 400 for minutes).
    with pytest.raises(openai.AuthenticationError) as refused:
        await client.chat.completions.create(model="x", messages=_conversation(2))
    assert f"rollout stopped: {limit}" in str(refused.value)
    assert refused.value.response.headers["x-should-retry"] == "false"
    assert trace.stop_condition == StopCondition(limit)
    assert len(trace.calls) == 2  # refused, not forwarded, and not retried by the SDK
    assert trace.ok


async def test_stop_hook_refuses_in_the_dialect_error_shape(icpt: Interception) -> None:
    async def solved(trace: Trace) -> str | None:
        return "solved" if trace.num_turns >= 1 else None

    trace = new_trace()
    secret = icpt.app.register(trace, stop_check=solved)
    client = anth(icpt, secret)
    await client.messages.create(model="x", max_tokens=10, messages=[USER])
    # The next turn (the same bytes again would be a retry of the first, answered from it).
    with pytest.raises(anthropic.PermissionDeniedError) as refused:
        await client.messages.create(model="x", max_tokens=10, messages=[USER, USER])
    assert "rollout stopped: stop_hook (solved)" in str(refused.value)
    assert trace.stop_condition is StopCondition.STOP_HOOK and len(trace.calls) == 1


# -- retries, tokens, policy version ------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
async def test_sdk_retry_is_answered_from_the_stored_exchange(
    model: tuple[ScriptedModel, str], stream: bool
) -> None:
    scripted, url = model
    # Unmarked resends within a window are coalesced too (tests/test_interception_retries.py);
    # without the window, only marked ones are.
    async with Interception(Upstream(url, model=MODEL), retry_window_s=None) as icpt:
        trace = new_trace()
        headers = {"authorization": f"Bearer {icpt.app.register(trace)}"}
        body = json.dumps({"model": "x", "messages": [USER], "stream": stream}).encode()
        async with httpx.AsyncClient(base_url=icpt.url) as http:
            first = await http.post("/chat/completions", content=body, headers=headers)
            retry = {**headers, "x-stainless-retry-count": "1"}
            second = await http.post("/chat/completions", content=body, headers=retry)
            assert first.status_code == second.status_code == 200
            assert first.content == second.content
            # Without the retry header the same body is a new turn.
            third = await http.post("/chat/completions", content=body, headers=headers)
            assert third.status_code == 200
    assert len(trace.calls) == 2 and scripted.calls == 2


async def test_retry_joins_the_call_in_flight() -> None:
    scripted = ScriptedModel("echo", latency=0.3)
    with scripted_server(scripted) as url:
        async with Interception(Upstream(url, model=MODEL)) as icpt:
            trace = new_trace()
            headers = {"authorization": f"Bearer {icpt.app.register(trace)}"}
            body = json.dumps({"messages": [USER]}).encode()
            async with httpx.AsyncClient(base_url=icpt.url) as http:
                first = asyncio.create_task(
                    http.post("/chat/completions", content=body, headers=headers)
                )
                while scripted.calls == 0 and not scripted.history:
                    await asyncio.sleep(0.01)
                retry = {**headers, "x-stainless-retry-count": "2"}
                second = await http.post("/chat/completions", content=body, headers=retry)
                assert (await first).content == second.content
    assert len(trace.calls) == 1 and scripted.calls == 1


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("route", ["chat", "responses", "anthropic"])
async def test_token_ids_and_logprobs_are_stored_unchanged(route: str, stream: bool) -> None:
    with scripted_server("tokens") as url:
        async with Interception(Upstream(url, model=MODEL)) as icpt:
            trace = new_trace()
            secret = icpt.app.register(trace)
            icpt.app.policy_version = 7
            text = "the quick brown fox"
            async with httpx.AsyncClient(base_url=icpt.url) as http:
                # The same request straight to the scripted model gives the reference values.
                requests: dict[str, tuple[str, dict[str, Any]]] = {
                    "chat": (
                        "/chat/completions",
                        {"messages": [{"role": "user", "content": text}]},
                    ),
                    "responses": ("/responses", {"input": text}),
                    "anthropic": ("/messages", {"messages": [USER | {"content": text}]}),
                }
                path, body = requests[route]
                body = {**body, "model": MODEL, "max_tokens": 50}
                if route == "responses":
                    body["max_output_tokens"] = body.pop("max_tokens")
                direct = (await http.post(f"{url}{path}", json=body)).json()
                headers = {"authorization": f"Bearer {secret}"}
                proxied = await http.post(path, json={**body, "stream": stream}, headers=headers)
                assert proxied.status_code == 200
    call = trace.calls[0]
    assert call.policy_version == 7 and call.streamed == stream
    assert call.prompt_token_ids == direct["prompt_token_ids"]
    ids = direct["choices"][0]["token_ids"] if route == "chat" else direct["token_ids"]
    assert call.completion_token_ids == ids and len(ids) > 0
    if route == "chat":
        entries = direct["choices"][0]["logprobs"]["content"]
    elif route == "anthropic":
        entries = direct["logprobs"]["content"]
    else:
        entries = direct["output"][0]["content"][0]["logprobs"]
    assert call.completion_logprobs == [e["logprob"] for e in entries]


# -- concurrency --------------------------------------------------------------------------------


async def test_concurrent_sessions_never_see_each_others_turns(icpt: Interception) -> None:
    traces = [new_trace() for _ in range(50)]
    secrets = [icpt.app.register(t) for t in traces]

    async def rollout(i: int) -> None:
        client = oai(icpt, secrets[i])
        messages: list[Any] = [{"role": "user", "content": f"session {i} turn 0"}]
        for turn in range(2):
            reply = await client.chat.completions.create(
                model="x", messages=messages, stream=turn == 1
            )
            if turn == 0:
                assert not isinstance(reply, openai.AsyncStream)
                messages.append({"role": "assistant", "content": reply.choices[0].message.content})
                messages.append({"role": "user", "content": f"session {i} turn 1"})
            else:
                assert isinstance(reply, openai.AsyncStream)
                async for _ in reply:
                    pass

    await asyncio.gather(*(rollout(i) for i in range(50)))
    for i, trace in enumerate(traces):
        assert len(trace.calls) == 2 and len(trace.branch_list) == 1
        texts = {m.text for m in trace.graph.values()}
        assert texts == {f"session {i} turn 0", f"session {i} turn 1"}


# -- upstream failures --------------------------------------------------------------------------


async def test_upstream_errors_are_relayed_and_recorded(model: tuple[ScriptedModel, str]) -> None:
    scripted, url = model
    async with Interception(Upstream(url, model=MODEL)) as icpt:
        trace = new_trace()
        client = oai(icpt, icpt.app.register(trace))
        scripted.fail_next(500)
        with pytest.raises(openai.InternalServerError):
            await client.chat.completions.create(model="x", messages=[USER])
        scripted.fail_next(429)
        with pytest.raises(openai.RateLimitError):
            await client.chat.completions.create(model="x", messages=[USER], stream=True)
        # An SDK retry after a failure is a fresh attempt, recorded as its own call.
        scripted.fail_next(503)
        retrying = oai(icpt, icpt.app.register(retried := new_trace()), retries=1)
        reply = await retrying.chat.completions.create(model="x", messages=[USER])
        assert reply.choices[0].message.content == "hello there"
    assert [c.error is not None for c in trace.calls] == [True, True]
    assert trace.calls[0].error is not None and "HTTP 500" in trace.calls[0].error.message
    assert trace.calls[0].response_id is None and trace.num_turns == 0
    assert [c.error is not None for c in retried.calls] == [True, False]
    assert trace.stop_condition is None


async def test_context_length_stops_the_rollout(model: tuple[ScriptedModel, str]) -> None:
    scripted, url = model
    async with Interception(Upstream(url, model=MODEL)) as icpt:
        trace = new_trace()
        client = anth(icpt, icpt.app.register(trace))
        scripted.fail_next("context_length")
        with pytest.raises(anthropic.BadRequestError, match="prompt is too long"):
            await client.messages.create(model="x", max_tokens=10, messages=[USER])
        with pytest.raises(
            anthropic.PermissionDeniedError, match="rollout stopped: context_length"
        ):
            await client.messages.create(model="x", max_tokens=10, messages=[USER])
    assert trace.stop_condition is StopCondition.CONTEXT_LENGTH
    assert len(trace.calls) == 1 and trace.calls[0].error is not None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_upstream_down_is_503_and_timeout_is_504() -> None:
    down = Upstream(f"http://127.0.0.1:{_free_port()}/v1", model=MODEL)
    async with Interception(down) as icpt:
        trace = new_trace()
        with pytest.raises(openai.APIStatusError) as failed:
            await oai(icpt, icpt.app.register(trace)).chat.completions.create(
                model="x", messages=[USER]
            )
        assert failed.value.status_code == 503
        assert trace.calls[0].error is not None and trace.calls[0].error.type == "ProviderError"
    with scripted_server("echo", latency=1.0) as url:
        settings = InterceptionSettings(upstream_timeout=0.2)
        async with Interception(Upstream(url, model=MODEL), settings=settings) as icpt:
            trace = new_trace()
            with pytest.raises(openai.APIStatusError) as failed:
                await oai(icpt, icpt.app.register(trace)).chat.completions.create(
                    model="x", messages=[USER]
                )
            assert failed.value.status_code == 504
            assert len(trace.calls) == 1


# Values json.dumps would write differently: an exponent, a \u escape, a wide character as
# UTF-8, a 30-digit integer, the client's own spacing; in a body over WORTH_FROM_BYTES.
CLIENT_TEXT = (
    b'{"model": "gpt-x", "messages": [{"role": "user", "content": "caf\xc3\xa9 \\u0041 '
    + b"filler " * 700
    + b'"}], "metadata": {"n" :1.0E+2, "big": 123456789012345678901234567890}, "temperature": 2.0}'
)


async def test_unchanged_values_go_upstream_as_the_client_wrote_them(
    model: tuple[ScriptedModel, str],
) -> None:
    """The body forwarded upstream reuses the client's text for every top-level value the
    interception did not set; the ones it set (model, sampling) are its own. A stop hook is
    handed the request and may change it in place: then the body is written out again, and the
    upstream gets what the hook left."""
    scripted, url = model
    upstream = Upstream(url, "sk-upstream", model=MODEL, sampling={"max_tokens": 64})
    async with Interception(upstream) as icpt, httpx.AsyncClient(base_url=icpt.url) as http:
        secret = icpt.app.register(new_trace(), sampling={"temperature": 0.5})
        headers = {"authorization": f"Bearer {secret}", "content-type": "application/json"}
        sent = await http.post("/chat/completions", content=CLIENT_TEXT, headers=headers)
        assert sent.status_code == 200, sent.text
        got = scripted.history[-1]
        assert b'"metadata": {"n" :1.0E+2, "big": 123456789012345678901234567890}' in got.raw
        assert b'"caf\xc3\xa9 \\u0041 filler filler' in got.raw
        expected = {**json.loads(CLIENT_TEXT), "model": MODEL, "max_tokens": 64}
        assert got.body == {**expected, "temperature": 0.5}

        async def widen(trace: Trace) -> str | None:
            request = PENDING_BODY.get()
            assert request is not None
            request["metadata"]["n"] = 7  # nested, in place: the top-level object is the same
            return None

        hooked = icpt.app.register(new_trace(), stop_check=widen)
        headers["authorization"] = f"Bearer {hooked}"
        sent = await http.post("/chat/completions", content=CLIENT_TEXT, headers=headers)
        assert sent.status_code == 200, sent.text
        got = scripted.history[-1]
        assert got.body["metadata"] == {"n": 7, "big": 123456789012345678901234567890}
        assert got.body["model"] == MODEL and got.body["temperature"] == 2.0


async def test_model_and_sampling_are_imposed_and_the_key_stays_in_the_proxy(
    model: tuple[ScriptedModel, str],
) -> None:
    scripted, url = model
    upstream = Upstream(url, "sk-upstream", model=MODEL, sampling={"max_tokens": 64})
    async with Interception(upstream) as icpt:
        trace = new_trace()
        secret = icpt.app.register(trace, sampling={"temperature": 0.0})
        await oai(icpt, secret).chat.completions.create(
            model="gpt-hacker", messages=[USER], temperature=2.0
        )
        await anth(icpt, secret).messages.create(model="claude", max_tokens=9, messages=[USER])
    chat, messages = scripted.history[-2], scripted.history[-1]
    assert chat.body["model"] == MODEL and chat.body["temperature"] == 0.0
    assert chat.body["max_tokens"] == 64
    assert chat.headers["authorization"] == "Bearer sk-upstream"
    assert messages.body["max_tokens"] == 64 and messages.headers["x-api-key"] == "sk-upstream"
    assert all(secret not in json.dumps(r.headers) for r in (chat, messages))
    assert "sk-upstream" not in trace.model_dump_json() and "sk-upstream" not in repr(upstream)
