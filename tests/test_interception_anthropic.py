"""The Anthropic request shapes Claude Code sends, through the proxy to the scripted model: a
``system`` of text blocks with ``cache_control``, ``role: "system"`` entries in ``messages``, and
``POST /v1/messages/count_tokens``."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anthropic
import httpx
import pytest

from vfray.interception import Interception, Upstream
from vfray.testing.scripted import ScriptedModel, scripted_server
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
