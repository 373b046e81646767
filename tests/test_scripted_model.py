"""The scripted model server over real sockets, driven by the real openai and anthropic SDKs."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st

from vfray.endpoints.serving import serve_in_loop
from vfray.models.scripted.conversation import tokenize
from vfray.models.scripted.policies import find_command, solve
from vfray.models.scripted.server import ScriptedModel, scripted_server

DIALECTS = ["chat", "responses", "anthropic"]
BASH_SCHEMA = {"type": "object", "properties": {"command": {"type": "string"}}}


@dataclass
class Answer:
    text: str
    tool: tuple[str, str, dict[str, Any]] | None  # (call id, name, arguments)
    finish: str
    usage: tuple[int, int]
    raw: Any


def _oai(url: str, **kw: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key="k", **kw)


def _ant(url: str, **kw: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url.removesuffix("/v1"), api_key="k", **kw)


def ask(
    url: str, dialect: str, stream: bool, prompt: str, tools: bool = False, **kw: Any
) -> Answer:
    """One user turn in ``dialect``, through the SDK's own parsing (stream helpers included)."""
    if dialect == "chat":
        extra: dict[str, Any] = {"tools": [_chat_tool()]} if tools else {}
        return chat(url, stream, [{"role": "user", "content": prompt}], **extra, **kw)
    if dialect == "responses":
        extra = {"tools": [_responses_tool()]} if tools else {}
        return responses(url, stream, prompt, **extra, **kw)
    extra = {"tools": [{"name": "bash", "input_schema": BASH_SCHEMA}]} if tools else {}
    return messages(url, stream, [{"role": "user", "content": prompt}], **extra, **kw)


def _chat_tool() -> dict[str, Any]:
    return {"type": "function", "function": {"name": "bash", "parameters": BASH_SCHEMA}}


def _responses_tool() -> dict[str, Any]:
    return {"type": "function", "name": "bash", "parameters": BASH_SCHEMA}


def chat(url: str, stream: bool, msgs: list[Any], **kw: Any) -> Answer:
    client = _oai(url)
    if stream:
        options: Any = {"include_usage": True}
        with client.chat.completions.stream(
            model="m", messages=msgs, stream_options=options, **kw
        ) as s:
            try:
                for _ in s:
                    pass
                result: Any = s.get_final_completion()
            except (
                openai.LengthFinishReasonError
            ) as exc:  # the helper refuses to parse a cut answer
                result = exc.completion
    else:
        result = client.chat.completions.create(model="m", messages=msgs, **kw)
    choice = result.choices[0]
    calls = choice.message.tool_calls or []
    tool = None
    if calls:
        tool = (calls[0].id, calls[0].function.name, json.loads(calls[0].function.arguments))
    usage = (result.usage.prompt_tokens, result.usage.completion_tokens)
    return Answer(choice.message.content or "", tool, choice.finish_reason, usage, result)


def responses(url: str, stream: bool, items: Any, **kw: Any) -> Answer:
    client = _oai(url)
    if stream and kw.get("max_output_tokens"):
        # A cut answer ends on response.incomplete, as OpenAI's does; the SDK's stream helper
        # only finishes on response.completed, so read the raw events.
        events = list(client.responses.create(model="m", input=items, stream=True, **kw))
        assert events[-1].type == "response.incomplete"
        result: Any = events[-1].response
    elif stream:
        with client.responses.stream(model="m", input=items, **kw) as s:
            for _ in s:
                pass
            result = s.get_final_response()
    else:
        result = client.responses.create(model="m", input=items, **kw)
    tool = None
    for item in result.output:
        if item.type == "function_call":
            tool = (item.call_id, item.name, json.loads(item.arguments))
    usage = (result.usage.input_tokens, result.usage.output_tokens)
    return Answer(result.output_text, tool, result.status, usage, result)


def messages(url: str, stream: bool, msgs: list[Any], max_tokens: int = 1000, **kw: Any) -> Answer:
    client = _ant(url)
    if stream:
        with client.messages.stream(model="m", max_tokens=max_tokens, messages=msgs, **kw) as s:
            for _ in s:
                pass
            result: Any = s.get_final_message()
    else:
        result = client.messages.create(model="m", max_tokens=max_tokens, messages=msgs, **kw)
    text = "".join(block.text for block in result.content if block.type == "text")
    tool = None
    for block in result.content:
        if block.type == "tool_use":
            tool = (block.id, block.name, block.input)
    usage = (result.usage.input_tokens, result.usage.output_tokens)
    return Answer(text, tool, result.stop_reason, usage, result)


@pytest.fixture(scope="module")
def echo_url() -> Iterator[str]:
    with scripted_server("echo") as url:
        yield url


@pytest.fixture(scope="module")
def bash_url() -> Iterator[str]:
    with scripted_server("bash") as url:
        yield url


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_echo_every_dialect(echo_url: str, dialect: str, stream: bool) -> None:
    answer = ask(echo_url, dialect, stream, "hello scripted  world")
    assert answer.text == "hello scripted  world"
    assert answer.tool is None
    assert answer.finish in ("stop", "completed", "end_turn")
    assert answer.usage == (3, 3)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_max_tokens_cuts_the_answer(echo_url: str, dialect: str, stream: bool) -> None:
    key = {"chat": "max_tokens", "responses": "max_output_tokens", "anthropic": "max_tokens"}
    limit: Any = {key[dialect]: 2}
    answer = ask(echo_url, dialect, stream, "one two three four five", **limit)
    assert answer.text == "one two"
    assert answer.finish in ("length", "incomplete", "max_tokens")
    assert answer.usage == (5, 2)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_arithmetic_every_dialect(dialect: str, stream: bool) -> None:
    with scripted_server("arithmetic") as url:
        assert ask(url, dialect, stream, "What is 12 + 30?").text == "42"


def test_arithmetic_forms() -> None:
    cases = {
        "What is 12 + 30?": 42,
        "what is 7 - 10": -3,
        "Compute 6 * 7.": 42,
        "What is 6 times 7?": 42,
        "what's 3 x 4?": 12,
        "What is 9 minus 4 plus 2?": 7,
        "Calculate (2 + 3) * 4": 20,
        "What is 84 divided by 2?": 42,
        "What is -5 + 2?": -3,
    }
    for question, expected in cases.items():
        assert solve(question) == expected, question
    assert solve("What is the capital of France?") is None
    assert solve("What is 1 / 0?") is None


def _answers(url: str, n: int, **kw: Any) -> list[str]:
    client = _oai(url)
    msgs: Any = [{"role": "user", "content": "What is 12 + 30?"}]
    return [
        client.chat.completions.create(model="m", messages=msgs, **kw).choices[0].message.content
        or ""
        for _ in range(n)
    ]


def test_accuracy_mixes_answers_deterministically_per_seed() -> None:
    runs = {}
    for name, seed, accuracy in (("a", 7, 0.5), ("b", 7, 0.5), ("c", 8, 0.5), ("d", 7, 0.0)):
        with scripted_server("arithmetic", accuracy=accuracy, seed=seed) as url:
            runs[name] = _answers(url, 40)
    first = runs["a"]
    assert 5 < first.count("42") < 35  # a mix of right and wrong answers
    assert all(answer.lstrip("-").isdigit() for answer in first)
    assert runs["b"] == first  # the same seed replays the same answers
    assert runs["c"] != first
    assert "42" not in runs["d"]


def test_request_seed_pins_the_sample() -> None:
    with scripted_server("arithmetic", accuracy=0.5, seed=3) as url:
        assert len(set(_answers(url, 6, seed=11))) == 1
        assert len({_answers(url, 1, seed=s)[0] for s in range(30)}) > 1


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_bash_tool_call_parses_in_the_sdk(bash_url: str, dialect: str, stream: bool) -> None:
    answer = ask(bash_url, dialect, stream, "Please list files: `ls -la /tmp`", tools=True)
    assert answer.tool is not None
    call_id, name, args = answer.tool
    assert call_id and name == "bash" and args == {"command": "ls -la /tmp"}
    assert answer.finish in ("tool_calls", "completed", "tool_use")


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_bash_answers_with_the_tool_output(bash_url: str, dialect: str, stream: bool) -> None:
    first = ask(bash_url, dialect, stream, "run: echo hi", tools=True)
    assert first.tool is not None
    call_id, _, args = first.tool
    assert args == {"command": "echo hi"}
    user = {"role": "user", "content": "run: echo hi"}
    if dialect == "chat":
        call = first.raw.choices[0].message.model_dump(exclude_none=True)
        tool = {"role": "tool", "tool_call_id": call_id, "content": "hi\n"}
        second = chat(bash_url, stream, [user, call, tool], tools=[_chat_tool()])
    elif dialect == "responses":
        output = {"type": "function_call_output", "call_id": call_id, "output": "hi\n"}
        items = [user, first.raw.output[0].model_dump(exclude_none=True), output]
        second = responses(bash_url, stream, items, tools=[_responses_tool()])
    else:
        result = {"type": "tool_result", "tool_use_id": call_id, "content": "hi\n"}
        assistant = {"role": "assistant", "content": first.raw.content}
        tools = [{"name": "bash", "input_schema": BASH_SCHEMA}]
        msgs = [user, assistant, {"role": "user", "content": [result]}]
        second = messages(bash_url, stream, msgs, tools=tools)
    assert second.tool is None
    assert second.text == "hi\n"


def test_bash_command_forms() -> None:
    assert find_command("do this:\n```bash\ncat a.txt | wc -l\n```") == "cat a.txt | wc -l"
    assert find_command("Use `pwd` please") == "pwd"
    assert find_command("Run: ls /") == "ls /"
    assert find_command("no command here") is None


def test_bash_without_a_tool_answers_in_text(bash_url: str) -> None:
    assert ask(bash_url, "chat", False, "run: whoami").text == "whoami"


@pytest.mark.parametrize("stream", [False, True])
def test_tokens_chat_carries_vllm_token_ids(stream: bool) -> None:
    with scripted_server("tokens") as url:
        client = _oai(url)
        msgs: Any = [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "a b c"},
        ]
        if not stream:
            result = client.chat.completions.create(model="m", messages=msgs)
            extra, choice = result.model_extra or {}, result.choices[0]
            ids = (choice.model_extra or {})["token_ids"]
            assert choice.logprobs is not None and choice.logprobs.content is not None
            logprobs = [entry.logprob for entry in choice.logprobs.content]
        else:
            chunks = list(client.chat.completions.create(model="m", messages=msgs, stream=True))
            extra = chunks[0].model_extra or {}
            ids, logprobs = [], []
            for chunk in chunks:
                for c in chunk.choices:
                    ids += (c.model_extra or {}).get("token_ids", [])
                    logprobs += (
                        [e.logprob for e in (c.logprobs.content or [])] if c.logprobs else []
                    )
    assert len(extra["prompt_token_ids"]) == 5  # "be brief" + "a b c"
    assert len(ids) == len(logprobs) == 3
    assert all(isinstance(i, int) for i in ids) and all(lp <= 0 for lp in logprobs)
    assert extra["prompt_token_ids"][-3:] == ids  # the same text, the same ids


@pytest.mark.parametrize("stream", [False, True])
def test_tokens_in_responses_and_anthropic(stream: bool) -> None:
    with scripted_server("tokens") as url:
        resp = responses(url, stream, "x y").raw
        assert resp.model_extra["token_ids"] and len(resp.model_extra["prompt_token_ids"]) == 2
        assert [lp.logprob for lp in resp.output[0].content[0].logprobs]
        if not stream:
            msg = messages(url, False, [{"role": "user", "content": "x y"}]).raw
            assert msg.model_extra["token_ids"] == resp.model_extra["token_ids"]
    # Any policy returns token ids when the request asks, as vLLM does.
    with scripted_server("arithmetic") as url:
        result = chat(url, stream, [{"role": "user", "content": "1+1?"}], logprobs=True).raw
        assert result.choices[0].logprobs.content[0].token == "2"


def test_tokenizer_round_trips_and_is_stable() -> None:
    @given(st.text())
    def check(text: str) -> None:
        assert "".join(tokenize(text)) == text

    check()


async def test_latency_is_applied_and_reported() -> None:
    model = ScriptedModel("echo", latency=0.05)
    async with serve_in_loop(model) as base:
        client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="k")
        msgs: Any = [{"role": "user", "content": "hi"}]
        raw = await client.chat.completions.with_raw_response.create(model="m", messages=msgs)
        assert raw.headers["x-scripted-latency"] == "0.05"
        order: list[str] = []

        async def call(name: str, latency: str) -> None:
            headers = {"x-scripted-latency": latency}
            await client.chat.completions.create(model="m", messages=msgs, extra_headers=headers)
            order.append(name)

        slow = asyncio.create_task(call("slow", "2.0"))
        await asyncio.sleep(0.2)  # the slow request is in the server first
        await call("fast", "0")
        await slow
        assert order == ["fast", "slow"]


async def test_stall_holds_a_stream_after_its_head_and_first_event() -> None:
    model = ScriptedModel("echo", stall=0.5)
    async with serve_in_loop(model) as base, httpx.AsyncClient(timeout=10) as http:
        body = {"model": "m", "input": "hi", "stream": True}
        loop = asyncio.get_running_loop()
        start = loop.time()
        async with http.stream("POST", f"{base}/v1/responses", json=body) as answer:
            arrivals = [(loop.time() - start, chunk) async for chunk in answer.aiter_text()]
    first_at, first = arrivals[0]
    assert first.startswith("event: response.created") and first_at < 0.4
    assert arrivals[-1][0] >= 0.5 and "response.completed" in arrivals[-1][1]
    with pytest.raises(ValueError, match="stall"):
        ScriptedModel("echo", stall=-1)


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("status", [500, 429, 503])
def test_injected_errors_reach_the_sdk(echo_url: str, dialect: str, status: int) -> None:
    headers = {"x-scripted-fail": str(status)}
    errors = (openai.APIStatusError, anthropic.APIStatusError)
    info: Any
    with pytest.raises(errors) as info:
        if dialect == "anthropic":
            _ant(echo_url, max_retries=0).messages.create(
                model="m",
                max_tokens=5,
                messages=[{"role": "user", "content": "x"}],
                extra_headers=headers,
            )
        elif dialect == "chat":
            _oai(echo_url, max_retries=0).chat.completions.create(
                model="m", messages=[{"role": "user", "content": "x"}], extra_headers=headers
            )
        else:
            _oai(echo_url, max_retries=0).responses.create(
                model="m", input="x", extra_headers=headers
            )
    assert info.value.status_code == status


def test_fail_count_lets_the_sdk_retry_succeed() -> None:
    model = ScriptedModel("echo")
    with scripted_server(model) as url:
        headers = {"x-scripted-fail": "429", "x-scripted-fail-count": "2"}
        result = _oai(url, max_retries=2).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "again"}], extra_headers=headers
        )
        assert result.choices[0].message.content == "again"
        assert model.calls == 1 and len(model.history) == 3
        model.fail_next(500)
        with pytest.raises(openai.InternalServerError):
            _oai(url, max_retries=0).responses.create(model="m", input="x")
        assert _oai(url, max_retries=0).responses.create(model="m", input="x").output_text == "x"


def test_context_length_errors() -> None:
    model = ScriptedModel("echo", context_window=10)
    with scripted_server(model) as url:
        msgs: Any = [{"role": "user", "content": "short"}]
        assert _oai(url).chat.completions.create(model="m", messages=msgs, max_tokens=5)
        with pytest.raises(openai.BadRequestError) as oai_error:
            _oai(url).chat.completions.create(model="m", messages=msgs, max_tokens=10)
        assert oai_error.value.code == "context_length_exceeded"
        assert _ant(url).messages.create(model="m", max_tokens=5, messages=msgs)
        with pytest.raises(anthropic.BadRequestError) as ant_error:
            _ant(url).messages.create(model="m", max_tokens=50, messages=msgs)
        assert "prompt is too long" in str(ant_error.value)
        with pytest.raises(openai.BadRequestError) as injected:
            _oai(url).responses.create(
                model="m", input="x", extra_headers={"x-scripted-fail": "context_length"}
            )
        assert injected.value.code == "context_length_exceeded"


@pytest.mark.parametrize(
    ("route", "body", "needle"),
    [
        ("/chat/completions", b"{not json", "not valid JSON"),
        ("/responses", b"\xff\xfe", "not valid JSON"),
        ("/messages", b"[1, 2]", "JSON object"),
        ("/chat/completions", b'{"model": "m"}', "messages"),
        ("/chat/completions", b'{"messages": [{"role": "robot"}]}', "role"),
        ("/chat/completions", b'{"messages": [{"role": "user", "content": 5}]}', "content"),
        ("/chat/completions", b'{"messages": [{"role": "user"}], "max_tokens": true}', "max_tok"),
        ("/responses", b'{"input": 3}', "input"),
        ("/responses", b'{"input": "x", "previous_response_id": "r"}', "previous_response"),
        ("/messages", b'{"messages": [{"role": "user", "content": "x"}]}', "max_tokens"),
    ],
)
def test_bad_input_is_a_400(echo_url: str, route: str, body: bytes, needle: str) -> None:
    response = httpx.post(echo_url + route, content=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert needle in error["message"]
    if route == "/messages":
        assert response.json()["type"] == "error"
        assert error["type"] == "invalid_request_error"


def test_bad_knob_headers_are_a_400(echo_url: str) -> None:
    body = {"messages": [{"role": "user", "content": "x"}]}
    for headers in ({"x-scripted-fail": "teapot"}, {"x-scripted-latency": "-1"}):
        response = httpx.post(echo_url + "/chat/completions", json=body, headers=headers)
        assert response.status_code == 400, headers


def test_models_and_health(echo_url: str) -> None:
    assert [m.id for m in _oai(echo_url).models.list()] == ["scripted"]
    assert [m.id for m in _ant(echo_url).models.list()] == ["scripted"]
    health = httpx.get(echo_url.removesuffix("/v1") + "/health").json()
    assert health["status"] == "ok" and health["policy"] == "echo"


def test_history_records_what_was_sent() -> None:
    model = ScriptedModel("echo")
    with scripted_server(model) as url:
        msgs: Any = [{"role": "user", "content": "x"}]
        _oai(url).chat.completions.create(model="m", messages=msgs, temperature=0.25)
    (received,) = model.history
    assert received.route == "/v1/chat/completions" and received.body["temperature"] == 0.25
    assert received.headers["authorization"] == "Bearer k"


def test_serve_model_cli() -> None:
    root = Path(__file__).resolve().parents[1]
    argv = [sys.executable, "-m", "vfray.cli.serve_model", "--policy", "arithmetic", "--port", "0"]
    proc = subprocess.Popen(argv, cwd=root, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        url = line.rsplit(" ", 1)[-1].strip()
        assert url.endswith("/v1"), line
        assert ask(url, "chat", False, "What is 2 + 2?").text == "4"
    finally:
        proc.terminate()
        # uvicorn shuts down gracefully, then re-raises the signal it caught.
        assert proc.wait(timeout=10) in (0, -signal.SIGTERM)
