"""Retry coalescing: a byte-identical request (or the same JSON, keys reordered) re-sent in one
session while the first is in flight, or shortly after it was answered, is the same call (one
ModelCall, the answer replayed), whatever ``x-stainless-retry-count`` says (Claude Code and
litellm send 0 on every retry)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from vfray.interception import Interception, Upstream
from vfray.models.scripted.server import ScriptedModel, scripted_server
from vfray.trace import TaskRecord, Trace

MODEL = "imposed-model"
UNMARKED = {"x-stainless-retry-count": "0"}
BODIES: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": ("/chat/completions", {"model": "x", "messages": [{"role": "user", "content": "hi"}]}),
    "responses": ("/responses", {"model": "x", "input": "hi"}),
    "anthropic": (
        "/messages",
        {"model": "x", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]},
    ),
}


def new_trace() -> Trace:
    return Trace(task=TaskRecord(key="k", hash="h"))


@pytest.fixture
def model() -> Iterator[tuple[ScriptedModel, str]]:
    scripted = ScriptedModel("echo")
    with scripted_server(scripted) as url:
        yield scripted, url


def _request(route: str, stream: bool) -> tuple[str, bytes]:
    path, body = BODIES[route]
    return path, json.dumps({**body, "stream": stream}).encode()


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("route", ["chat", "responses", "anthropic"])
async def test_unmarked_resend_while_in_flight_joins_the_call(route: str, stream: bool) -> None:
    scripted = ScriptedModel("echo", latency=0.5)
    with scripted_server(scripted) as url:
        async with Interception(Upstream(url, model=MODEL)) as icpt:
            trace = new_trace()
            headers = {"authorization": f"Bearer {icpt.app.register(trace)}", **UNMARKED}
            path, body = _request(route, stream)
            async with httpx.AsyncClient(base_url=icpt.url, timeout=30) as http:
                first = asyncio.create_task(http.post(path, content=body, headers=headers))
                while not scripted.history:
                    await asyncio.sleep(0.01)
                second = await http.post(path, content=body, headers=headers)
                answer = await first
    assert answer.status_code == second.status_code == 200
    # The very same bytes (ids included): the answer was replayed, not sampled again.
    assert answer.content == second.content
    assert len(trace.calls) == 1 and scripted.calls == 1 and len(scripted.history) == 1
    assert trace.calls[0].streamed == stream and trace.calls[0].response_id is not None


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("route", ["chat", "responses", "anthropic"])
async def test_unmarked_resend_just_after_the_answer_is_replayed(
    model: tuple[ScriptedModel, str], route: str, stream: bool
) -> None:
    scripted, url = model
    async with Interception(Upstream(url, model=MODEL)) as icpt:
        trace = new_trace()
        headers = {"authorization": f"Bearer {icpt.app.register(trace)}", **UNMARKED}
        path, body = _request(route, stream)
        async with httpx.AsyncClient(base_url=icpt.url, timeout=30) as http:
            first = await http.post(path, content=body, headers=headers)
            # No header at all is the same as 0.
            bare = {"authorization": headers["authorization"]}
            second = await http.post(path, content=body, headers=bare)
    assert first.status_code == second.status_code == 200
    assert first.content == second.content
    assert len(trace.calls) == 1 and scripted.calls == 1


async def test_resend_after_the_window_is_a_new_call(model: tuple[ScriptedModel, str]) -> None:
    scripted, url = model
    async with Interception(Upstream(url, model=MODEL), retry_window_s=0.2) as icpt:
        trace = new_trace()
        headers = {"authorization": f"Bearer {icpt.app.register(trace)}", **UNMARKED}
        path, body = _request("chat", False)
        async with httpx.AsyncClient(base_url=icpt.url, timeout=30) as http:
            first = await http.post(path, content=body, headers=headers)
            await asyncio.sleep(0.4)
            second = await http.post(path, content=body, headers=headers)
            # A marked retry still replays the newest answer, however late.
            marked = {**headers, "x-stainless-retry-count": "1"}
            await asyncio.sleep(0.4)
            third = await http.post(path, content=body, headers=marked)
    assert first.content != second.content  # a fresh completion id: sampled again
    assert third.content == second.content
    assert len(trace.calls) == 2 and scripted.calls == 2


async def test_window_none_coalesces_marked_retries_only(model: tuple[ScriptedModel, str]) -> None:
    scripted, url = model
    async with Interception(Upstream(url, model=MODEL), retry_window_s=None) as icpt:
        trace = new_trace()
        headers = {"authorization": f"Bearer {icpt.app.register(trace)}", **UNMARKED}
        path, body = _request("anthropic", True)
        async with httpx.AsyncClient(base_url=icpt.url, timeout=30) as http:
            await http.post(path, content=body, headers=headers)
            await http.post(path, content=body, headers=headers)
    assert len(trace.calls) == 2 and scripted.calls == 2


async def test_failed_call_is_not_replayed_and_other_bodies_are_not_joined(
    model: tuple[ScriptedModel, str],
) -> None:
    scripted, url = model
    async with Interception(Upstream(url, model=MODEL)) as icpt:
        trace, other = new_trace(), new_trace()
        headers = {"authorization": f"Bearer {icpt.app.register(trace)}", **UNMARKED}
        path, body = _request("chat", False)
        scripted.fail_next(500)
        async with httpx.AsyncClient(base_url=icpt.url, timeout=30) as http:
            failed = await http.post(path, content=body, headers=headers)
            retried = await http.post(path, content=body, headers=headers)
            # Another request in between does not hide the earlier answer from a retry.
            _, longer = _request("chat", True)
            await http.post(path, content=longer, headers=headers)
            again = await http.post(path, content=body, headers=headers)
            # Another session's identical body is its own call.
            mine = {"authorization": f"Bearer {icpt.app.register(other)}", **UNMARKED}
            theirs = await http.post(path, content=body, headers=mine)
    assert failed.status_code == 500 and retried.status_code == 200
    assert again.content == retried.content and theirs.content != retried.content
    assert [c.error is not None for c in trace.calls] == [True, False, False]
    assert len(other.calls) == 1 and scripted.calls == 3


async def test_a_resend_with_its_keys_reordered_is_the_same_call(
    model: tuple[ScriptedModel, str],
) -> None:
    """Codex re-sends its Responses body with ``client_metadata``'s keys in a fresh order."""
    scripted, url = model
    async with Interception(Upstream(url, model=MODEL)) as icpt:
        trace = new_trace()
        headers = {"authorization": f"Bearer {icpt.app.register(trace)}", **UNMARKED}
        meta = {"thread_id": "t", "turn_id": "u", "window": "w"}
        body = {"model": "x", "input": "hi", "stream": True, "client_metadata": meta}
        resent = {**body, "client_metadata": dict(reversed(meta.items()))}
        # As long as the first, not the same JSON: its own call.
        other = {**body, "client_metadata": {**meta, "window": "v"}}
        async with httpx.AsyncClient(base_url=icpt.url, timeout=30) as http:
            first = await http.post("/responses", content=json.dumps(body), headers=headers)
            second = await http.post("/responses", content=json.dumps(resent), headers=headers)
            third = await http.post("/responses", content=json.dumps(other), headers=headers)
    assert json.dumps(body) != json.dumps(resent)
    assert len(json.dumps(other)) == len(json.dumps(body))
    assert first.content == second.content != third.content
    assert len(trace.calls) == 2 and scripted.calls == 2


def test_retry_window_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="retry_window_s"):
        Interception(Upstream("http://127.0.0.1:1/v1", model=MODEL), retry_window_s=-1.0)


# -- the real SDKs, retrying a request that timed out on their side ------------------------------


async def _sdk_call(icpt: Interception, secret: str, route: str, stream: bool) -> str:
    """One call through the SDK with a 0.6 s timeout and retries on, every attempt marked 0."""
    if route == "anthropic":
        client = anthropic.AsyncAnthropic(
            base_url=icpt.root_url, api_key=secret, max_retries=3, timeout=0.6
        )
        messages: Any = [{"role": "user", "content": "hi"}]
        if stream:
            async with client.messages.stream(
                model="x", max_tokens=50, messages=messages, extra_headers=UNMARKED
            ) as events:
                return await events.get_final_text()
        reply = await client.messages.create(
            model="x", max_tokens=50, messages=messages, extra_headers=UNMARKED
        )
        block = reply.content[0]
        assert block.type == "text"
        return block.text
    oai = openai.AsyncOpenAI(base_url=icpt.url, api_key=secret, max_retries=3, timeout=0.6)
    if route == "responses":
        if stream:
            text = ""
            async for event in await oai.responses.create(
                model="x", input="hi", stream=True, extra_headers=UNMARKED
            ):
                if event.type == "response.output_text.delta":
                    text += event.delta
            return text
        answer = await oai.responses.create(model="x", input="hi", extra_headers=UNMARKED)
        return answer.output_text
    chat: Any = [{"role": "user", "content": "hi"}]
    if stream:
        text = ""
        async for chunk in await oai.chat.completions.create(
            model="x", messages=chat, stream=True, extra_headers=UNMARKED
        ):
            text += (chunk.choices[0].delta.content or "") if chunk.choices else ""
        return text
    completion = await oai.chat.completions.create(model="x", messages=chat, extra_headers=UNMARKED)
    return completion.choices[0].message.content or ""


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("route", ["chat", "responses", "anthropic"])
async def test_sdk_retries_marked_zero_record_one_call(route: str, stream: bool) -> None:
    # The model takes 2 s; the SDK gives up on each attempt after 0.6 s and retries the same
    # bytes, as Claude Code does, with the retry count header at 0.
    scripted = ScriptedModel("echo", latency=2.0)
    with scripted_server(scripted) as url:
        async with Interception(Upstream(url, model=MODEL)) as icpt:
            trace = new_trace()
            secret = icpt.app.register(trace)
            text = await _sdk_call(icpt, secret, route, stream)
    assert text == "hi"
    assert len(trace.calls) == 1 and scripted.calls == 1 and len(scripted.history) == 1
    assert trace.calls[0].error is None and trace.calls[0].streamed == stream
