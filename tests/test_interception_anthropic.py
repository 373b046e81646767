"""The Anthropic request shapes Claude Code sends, through the proxy to the scripted model: a
``system`` of text blocks with ``cache_control``, ``role: "system"`` entries in ``messages``, and
``POST /v1/messages/count_tokens``."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from vfray.interception import Interception, Limits, Upstream
from vfray.models.scripted.server import ScriptedModel, scripted_server
from vfray.trace import TaskRecord, Trace
from vfray.traces import table_to_traces, traces_to_table

MODEL = "imposed-model"
CACHED = {"type": "ephemeral"}
SYSTEM: Any = [
    {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."},
    {"type": "text", "text": "Be brief.", "cache_control": CACHED},
]


def new_trace() -> Trace:
    return Trace(task=TaskRecord(key="k", hash="h"))


@pytest.fixture
def scripted() -> Iterator[tuple[ScriptedModel, str]]:
    model = ScriptedModel("echo")
    with scripted_server(model) as url:
        yield model, url


@pytest.fixture
async def icpt(scripted: tuple[ScriptedModel, str]) -> AsyncIterator[Interception]:
    async with Interception(Upstream(scripted[1], "upstream-key", model=MODEL)) as i:
        yield i


@pytest.mark.parametrize("stream", [False, True])
async def test_system_blocks_are_recorded_as_blocks(
    icpt: Interception, scripted: tuple[ScriptedModel, str], stream: bool
) -> None:
    trace = new_trace()
    client = anthropic.AsyncAnthropic(
        base_url=icpt.root_url, api_key=icpt.app.register(trace), max_retries=0
    )
    history: Any = [{"role": "user", "content": "hi"}]
    reply = await client.messages.create(
        model="x", max_tokens=50, system=SYSTEM, messages=history, stream=stream
    )
    if stream:
        assert [event.type async for event in reply][-1] == "message_stop"  # type: ignore[union-attr]
    # Next turn the cache breakpoint moves to the first block (Claude Code moves them).
    moved = [{**SYSTEM[0], "cache_control": CACHED}, {"type": "text", "text": "Be brief."}]
    history += [{"role": "assistant", "content": "hi"}, {"role": "user", "content": "again"}]
    await client.messages.create(model="x", max_tokens=50, system=moved, messages=history)

    # Upstream got the blocks exactly as sent.
    assert [r.body["system"] for r in scripted[0].history] == [SYSTEM, moved]
    first = trace.graph[trace.calls[0].request_ids[0]]
    assert first.role == "system"
    assert first.content == [
        {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."},
        {"type": "text", "text": "Be brief."},
    ]
    # The same prompt with its breakpoint moved is the same message: one branch, not a fork.
    assert len(trace.branch_list) == 1 and len(trace.calls) == 2
    assert trace.calls[1].request_ids[0] == trace.calls[0].request_ids[0]

    # The Parquet trace table keeps the blocks (raw_json) and reads back equal.
    table = traces_to_table([trace])
    row = table.column("messages").to_pylist()[0][0]
    assert row["content"] == "You are Claude Code, Anthropic's official CLI for Claude.Be brief."
    assert json.loads(row["raw_json"])["content"] == first.content
    assert table_to_traces(table)[0] == trace


@pytest.mark.parametrize("stream", [False, True])
async def test_system_entries_in_messages_pass_through_and_are_recorded(
    icpt: Interception, scripted: tuple[ScriptedModel, str], stream: bool
) -> None:
    trace = new_trace()
    messages: Any = [
        {"role": "user", "content": [{"type": "text", "text": "fix the bug"}]},
        {"role": "system", "content": "<env>Working directory: /work</env>"},
        {"role": "user", "content": "please"},
    ]
    body = {"model": "x", "max_tokens": 50, "system": SYSTEM, "messages": messages}
    headers = {"x-api-key": icpt.app.register(trace), "anthropic-version": "2023-06-01"}
    async with httpx.AsyncClient(base_url=icpt.url, timeout=30) as http:
        response = await http.post("/messages", json={**body, "stream": stream}, headers=headers)
    assert response.status_code == 200, response.text
    sent = scripted[0].history[-1].body
    assert sent["messages"] == messages and sent["system"] == SYSTEM and sent["model"] == MODEL
    recorded = [trace.graph[i] for i in trace.calls[0].request_ids]
    assert [(m.role, m.text) for m in recorded] == [
        ("system", "You are Claude Code, Anthropic's official CLI for Claude.Be brief."),
        ("user", "fix the bug"),
        ("system", "<env>Working directory: /work</env>"),
        ("user", "please"),
    ]
    assert trace.calls[0].error is None and trace.last_reply is not None


async def test_malformed_system_blocks_are_a_400(icpt: Interception) -> None:
    trace = new_trace()
    body = {"model": "x", "max_tokens": 5, "system": ["not a block"], "messages": []}
    async with httpx.AsyncClient(base_url=icpt.url, timeout=30) as http:
        response = await http.post(
            "/messages", json=body, headers={"x-api-key": icpt.app.register(trace)}
        )
    assert response.status_code == 400 and "system[0]" in response.text
    assert trace.calls == []


# -- count_tokens and models ---------------------------------------------------------------------


COUNTED: Any = {
    "model": "claude-under-test",
    "system": SYSTEM,
    "messages": [{"role": "user", "content": "how many tokens is this?"}],
}


async def test_count_tokens_is_forwarded_when_the_upstream_serves_it(
    icpt: Interception, scripted: tuple[ScriptedModel, str]
) -> None:
    model, url = scripted
    trace = new_trace()
    client = anthropic.AsyncAnthropic(
        base_url=icpt.root_url, api_key=icpt.app.register(trace, Limits(max_turns=1)), max_retries=0
    )
    counted = await client.messages.count_tokens(**COUNTED)
    async with httpx.AsyncClient(timeout=30) as http:
        direct = await http.post(f"{url}/messages/count_tokens", json=COUNTED)
    assert counted.input_tokens == direct.json()["input_tokens"] > 0
    assert model.token_counts == 2 and model.calls == 0
    # Not a model turn: the one turn max_turns allows is still there, and counting goes on after.
    await client.messages.create(max_tokens=20, **COUNTED)
    assert (await client.messages.count_tokens(**COUNTED)).input_tokens == counted.input_tokens
    assert len(trace.calls) == 1 and trace.stop_condition is None


async def test_count_tokens_is_estimated_when_the_upstream_has_no_such_route() -> None:
    model = ScriptedModel("echo", count_tokens=False)
    with scripted_server(model) as url:
        async with Interception(Upstream(url, model=MODEL)) as icpt:
            trace = new_trace()
            client = anthropic.AsyncAnthropic(
                base_url=icpt.root_url, api_key=icpt.app.register(trace), max_retries=0
            )
            first = await client.messages.count_tokens(**COUNTED)
            second = await client.messages.count_tokens(**COUNTED)
            assert icpt.app.token_counter.upstream_serves is False
    counted = {k: COUNTED[k] for k in ("system", "messages")}
    size = len(json.dumps(counted, separators=(",", ":")).encode())
    assert first.input_tokens == second.input_tokens == -(-size // 4)
    assert trace.calls == [] and model.token_counts == 0


async def test_count_tokens_is_authenticated_and_validated(icpt: Interception) -> None:
    trace = new_trace()
    secret = icpt.app.register(trace)
    async with httpx.AsyncClient(base_url=icpt.url, timeout=30) as http:
        missing = await http.post("/messages/count_tokens", json=COUNTED)
        wrong = await http.post("/messages/count_tokens", json=COUNTED, headers={"x-api-key": "no"})
        bad = await http.post(
            "/messages/count_tokens", json={"messages": 3}, headers={"x-api-key": secret}
        )
        icpt.app.conclude(secret)
        late = await http.post(
            "/messages/count_tokens", json=COUNTED, headers={"x-api-key": secret}
        )
        get = await http.get("/messages/count_tokens", headers={"x-api-key": secret})
    # An unknown key and a concluded rollout get the messages route's final status (403, which
    # Claude Code gives up on at once) and x-should-retry: false, like the messages route.
    assert (missing.status_code, wrong.status_code, bad.status_code) == (401, 403, 400)
    assert late.status_code == 403 and "concluded" in late.text and get.status_code == 405
    assert late.headers["x-should-retry"] == "false"
    assert missing.json()["type"] == "error"
    assert missing.json()["error"]["type"] == "authentication_error"
    assert trace.calls == [] and trace.notes == []


async def test_models_list_reads_in_both_sdks(icpt: Interception) -> None:
    secret = icpt.app.register(new_trace())
    oai_models = await openai.AsyncOpenAI(base_url=icpt.url, api_key=secret).models.list()
    assert [m.id for m in oai_models.data] == [MODEL]
    assert oai_models.data[0].object == "model" and oai_models.data[0].owned_by == "vfray"
    page = await anthropic.AsyncAnthropic(base_url=icpt.root_url, api_key=secret).models.list()
    info = page.data[0]
    assert [m.id for m in page.data] == [MODEL]
    assert (info.type, info.display_name, info.created_at.year) == ("model", MODEL, 1970)
    assert page.has_more is False and page.last_id == MODEL
