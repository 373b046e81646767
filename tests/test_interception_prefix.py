"""Reusing a session's parsed history: real SDKs -> proxy -> scripted model record exactly the
trace a from-scratch parse of every request gives, through long runs, rewrites and edits."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vfray.interception import Interception, Upstream
from vfray.interception.dialects import DIALECTS, DialectError
from vfray.interception.dialects.prefix import PrefixCache
from vfray.models.scripted.server import ScriptedModel, scripted_server
from vfray.trace import Message, TaskRecord, Trace

MODEL = "imposed-model"
SYSTEM: Any = {"role": "system", "content": "You are a careful agent."}
BASH_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "bash",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
    },
}


def new_trace() -> Trace:
    return Trace(task=TaskRecord(key="k", hash="h"))


@pytest.fixture
def echo() -> Iterator[tuple[ScriptedModel, str]]:
    scripted = ScriptedModel("echo")
    with scripted_server(scripted) as url:
        yield scripted, url


@pytest.fixture
async def icpt(echo: tuple[ScriptedModel, str]) -> AsyncIterator[Interception]:
    async with Interception(Upstream(echo[1], model=MODEL)) as served:
        yield served


def from_scratch(trace: Trace, requests: list[dict[str, Any]]) -> Trace:
    """The trace the interception recorded before it reused parsed history: every request parsed
    afresh, every message (then the reply) offered to the graph in order."""
    reference = new_trace()
    for call, body in zip(trace.calls, requests, strict=True):
        messages = DIALECTS[call.dialect].parse_request(body).messages  # no cache
        reply = trace.graph[call.response_id] if call.response_id is not None else None
        for message in [*messages, *([reply] if reply is not None else [])]:
            reference.add_message(message)
        fields = call.model_dump(exclude={"index", "request_ids", "response_id", "branch"})
        reference.record_call(messages, reply, **fields)
    return reference


def assert_same_record(trace: Trace, scripted: ScriptedModel) -> Trace:
    reference = from_scratch(trace, [r.body for r in scripted.history])
    assert list(trace.graph.items()) == list(reference.graph.items())
    assert trace.branch_list == reference.branch_list
    assert trace.calls == reference.calls
    fields = {"graph", "branch_list", "calls"}
    assert trace.model_dump_json(include=fields) == reference.model_dump_json(include=fields)
    return reference


async def chat_turn(client: openai.AsyncOpenAI, messages: list[Any], stream: bool) -> str:
    if not stream:
        reply = await client.chat.completions.create(model="x", messages=messages)
        return reply.choices[0].message.content or ""
    chunks = await client.chat.completions.create(model="x", messages=messages, stream=True)
    return "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])


# -- chat completions over HTTP --------------------------------------------------------------


async def test_a_40_turn_conversation_records_the_from_scratch_trace(
    icpt: Interception, echo: tuple[ScriptedModel, str]
) -> None:
    trace = new_trace()
    client = openai.AsyncOpenAI(base_url=icpt.url, api_key=icpt.app.register(trace))
    messages: list[Any] = [SYSTEM]
    for turn in range(40):
        messages.append({"role": "user", "content": f"turn {turn}: " + "word " * turn})
        text = await chat_turn(client, messages, stream=turn % 3 == 2)
        messages.append({"role": "assistant", "content": text})
    assert_same_record(trace, echo[0])
    assert len(trace.calls) == 40 and len(trace.branch_list) == 1
    assert len(trace.graph) == 81 and trace.branch_list[0].message_ids == list(trace.graph)
    for before, after in zip(trace.calls, trace.calls[1:], strict=False):
        assert after.request_ids[: len(before.request_ids) + 1] == [
            *before.request_ids,
            before.response_id,
        ]
    assert [m.text for m in trace.messages] == [m["content"] for m in messages]


async def test_a_history_rewrite_mid_conversation_branches_as_before(
    icpt: Interception, echo: tuple[ScriptedModel, str]
) -> None:
    trace = new_trace()
    client = openai.AsyncOpenAI(base_url=icpt.url, api_key=icpt.app.register(trace))
    messages: list[Any] = [SYSTEM]
    for turn in range(10):
        messages.append({"role": "user", "content": f"step {turn}"})
        messages.append({"role": "assistant", "content": await chat_turn(client, messages, False)})
    # The agent compacts: the system prompt stays, the history becomes one summary.
    compacted: list[Any] = [SYSTEM, {"role": "user", "content": "Summary: steps 0-9 done."}]
    for turn in range(10, 15):
        compacted.append({"role": "user", "content": f"step {turn}"})
        compacted.append(
            {"role": "assistant", "content": await chat_turn(client, compacted, turn == 12)}
        )
    # Then it goes back to the long history once more (e.g. a retry of the uncompacted run).
    messages.append({"role": "user", "content": "one more"})
    await chat_turn(client, messages, False)
    assert_same_record(trace, echo[0])
    assert [c.branch for c in trace.calls] == [0] * 10 + [1] * 5 + [0]
    assert trace.branch_list[0].message_ids[0] == trace.branch_list[1].message_ids[0]
    assert [m.text for m in trace.branches[1]][:2] == [
        "You are a careful agent.",
        compacted[1]["content"],
    ]


async def test_an_earlier_message_edited_to_the_same_length_is_not_reused(
    icpt: Interception, echo: tuple[ScriptedModel, str]
) -> None:
    trace = new_trace()
    client = openai.AsyncOpenAI(base_url=icpt.url, api_key=icpt.app.register(trace))
    messages: list[Any] = [SYSTEM]
    for turn in range(6):
        messages.append({"role": "user", "content": f"what is {turn} + {turn}?"})
        messages.append({"role": "assistant", "content": await chat_turn(client, messages, False)})
    original = messages[3]["content"]
    edited = [*messages, {"role": "user", "content": "sure?"}]
    edited[3] = {"role": "assistant", "content": original.replace("1", "7")}
    assert len(edited[3]["content"]) == len(original) and edited[3] != messages[3]
    await chat_turn(client, edited, False)
    reference = assert_same_record(trace, echo[0])
    last = trace.calls[-1]
    assert last.branch == 1 and len(trace.branch_list) == 2
    assert last.request_ids[:3] == trace.calls[-2].request_ids[:3]  # the untouched prefix
    assert last.request_ids[3] != trace.branch_list[0].message_ids[3]
    assert trace.graph[last.request_ids[3]].text == edited[3]["content"]
    assert last.request_ids == reference.calls[-1].request_ids


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ({"content": 1}, {"content": 1.0}),
        ({"content": 1}, {"content": True}),
        ({"content": 0.0}, {"content": -0.0}),
        ({"content": "x", "tag": 1, "lang": "en"}, {"content": "x", "lang": "en", "tag": 1}),
        ({"content": [{"type": "image", "n": 1}]}, {"content": [{"type": "image", "n": 1.0}]}),
    ],
)
async def test_values_python_calls_equal_are_not_mistaken_for_a_repeat(
    icpt: Interception,
    echo: tuple[ScriptedModel, str],
    first: dict[str, Any],
    second: dict[str, Any],
) -> None:
    # 1 == 1.0 == True and -0.0 == 0.0 in Python, and dicts compare without key order, yet they
    # hash (or serialize) differently: the second request must be parsed, not reused.
    trace = new_trace()
    headers = {"authorization": f"Bearer {icpt.app.register(trace)}"}
    async with httpx.AsyncClient(base_url=icpt.url) as http:
        for indent, variant in enumerate((first, second, first)):
            body = {"model": "x", "messages": [SYSTEM, {"role": "user", **variant}]}
            # The scripted model refuses non-text content (400); the call is recorded all the same.
            # Laid out differently each time: the same bytes again would be a retry (replayed).
            raw = json.dumps(body, indent=indent)
            response = await http.post("/chat/completions", content=raw, headers=headers)
            assert response.status_code in (200, 400)
    assert len(trace.calls) == 3
    assert_same_record(trace, echo[0])
    assert [c.request_ids[1] for c in trace.calls] == [
        Message(role="user", **v).id for v in (first, second, first)
    ]


# -- the folding dialects over HTTP: Responses items and Anthropic blocks --------------------


async def test_responses_tool_loop_records_the_from_scratch_trace() -> None:
    scripted = ScriptedModel("bash")
    with scripted_server(scripted) as url:
        async with Interception(Upstream(url, model=MODEL)) as icpt:
            trace = new_trace()
            client = openai.AsyncOpenAI(base_url=icpt.url, api_key=icpt.app.register(trace))
            tools: Any = [{"type": "function", "name": "bash", "parameters": {"type": "object"}}]
            items: list[Any] = []
            for turn in range(8):
                items.append({"role": "user", "content": f"Run `echo {turn}` please"})
                for _ in range(2):  # a function call, then the answer to its output
                    reply = await client.responses.create(
                        model="x", instructions="sys", input=items, tools=tools, stream=False
                    )
                    items.extend(item.model_dump(exclude_none=True) for item in reply.output)
                    calls = [i for i in reply.output if i.type == "function_call"]
                    for call in calls:
                        items.append(
                            {
                                "type": "function_call_output",
                                "call_id": call.call_id,
                                "output": f"{turn}",
                            }
                        )
    assert_same_record(trace, scripted)
    assert len(trace.calls) == 16 and len(trace.branch_list) == 1
    assert trace.last_reply == "7"


async def test_anthropic_tool_loop_records_the_from_scratch_trace() -> None:
    scripted = ScriptedModel("bash")
    with scripted_server(scripted) as url:
        async with Interception(Upstream(url, model=MODEL)) as icpt:
            trace = new_trace()
            client = anthropic.AsyncAnthropic(
                base_url=icpt.root_url, api_key=icpt.app.register(trace), max_retries=0
            )
            tools: Any = [{"name": "bash", "input_schema": {"type": "object"}}]
            messages: list[Any] = []
            for turn in range(8):
                messages.append({"role": "user", "content": f"Run `echo {turn}` please"})
                for _ in range(2):
                    reply = await client.messages.create(
                        model="x", max_tokens=100, system="sys", messages=messages, tools=tools
                    )
                    blocks = [b.model_dump(exclude_none=True) for b in reply.content]
                    messages.append({"role": "assistant", "content": blocks})
                    uses = [b for b in reply.content if b.type == "tool_use"]
                    if uses:
                        results = [
                            {"type": "tool_result", "tool_use_id": u.id, "content": str(turn)}
                            for u in uses
                        ]
                        messages.append({"role": "user", "content": results})
    assert_same_record(trace, scripted)
    assert len(trace.calls) == 16 and len(trace.branch_list) == 1


# -- the cache itself: reuse is real, and never changes a parse -------------------------------


def test_a_repeated_prefix_reuses_the_parsed_messages_and_an_edit_does_not() -> None:
    chat = DIALECTS["chat"]
    cache = PrefixCache()
    history: list[Any] = [SYSTEM, {"role": "user", "content": "abc"}]
    first = chat.parse_request({"messages": history}, cache).messages
    history += [{"role": "assistant", "content": "abc"}, {"role": "user", "content": "def"}]
    second = chat.parse_request({"messages": json.loads(json.dumps(history))}, cache).messages
    assert all(a is b for a, b in zip(first, second[:2], strict=False))  # parsed once
    edited = json.loads(json.dumps(history))
    edited[1]["content"] = "abd"  # same length, same position
    third = chat.parse_request({"messages": edited}, cache).messages
    assert third[0] is first[0] and third[1] is not first[1]
    assert third[1].id != first[1].id and third[1].text == "abd"
    assert [m.id for m in third] == [
        m.id for m in chat.parse_request({"messages": edited}).messages
    ]
    # Same keys in another order: the same id, but the parse must keep the new order.
    reordered = [SYSTEM, {"content": "abc", "role": "user", "tag": 1, "lang": "en"}]
    chat.parse_request({"messages": reordered}, cache)
    reordered[1] = {"content": "abc", "role": "user", "lang": "en", "tag": 1}
    fourth = chat.parse_request({"messages": reordered}, cache).messages
    assert fourth[1].model_dump_json().endswith('"lang":"en","tag":1}')


@pytest.mark.parametrize(
    ("dialect", "field", "system", "changed"),
    [
        ("responses", "instructions", "You are Codex.", "You are Codex!"),
        (
            "anthropic",
            "system",
            [{"type": "text", "text": "You are Claude.", "cache_control": {"type": "ephemeral"}}],
            [{"text": "You are Claude.", "type": "text"}],  # the same text, keys reordered
        ),
    ],
)
def test_the_system_prompt_is_parsed_once_while_it_stays_the_same(
    dialect: str, field: str, system: Any, changed: Any
) -> None:
    parse, cache = DIALECTS[dialect].parse_request, PrefixCache()
    items = _FIELD[dialect]

    def body(system: Any, n: int) -> dict[str, Any]:
        return json.loads(
            json.dumps({field: system, items: [{"role": "user", "content": "a"}] * n})
        )

    first = parse(body(system, 1), cache).messages[0]
    again = parse(body(system, 2), cache).messages[0]
    assert again is first and first.role == "system"
    other = parse(body(changed, 3), cache).messages[0]
    scratch = parse(body(changed, 3)).messages[0]
    assert other is not first and other.model_dump_json() == scratch.model_dump_json()
    assert other.id == scratch.id


_TEXT = st.sampled_from(["a", "b", "run `ls`"])
_NUMBER = st.sampled_from([0, 1, 0.0, -0.0, 1.0, True, False])
_LEAF = _TEXT | _NUMBER | st.none()
_CHAT_ITEM = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system", "tool", ""])},
    optional={
        "content": _LEAF
        | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": _TEXT})),
        "name": _TEXT,
        "tool_call_id": _TEXT | _NUMBER,
        "tool_calls": st.lists(
            st.fixed_dictionaries(
                {
                    "id": _TEXT,
                    "function": st.fixed_dictionaries({"name": _TEXT, "arguments": _LEAF}),
                }
            ),
            max_size=2,
        ),
        "extra": _LEAF,
    },
)
_RESPONSES_ITEM = st.one_of(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "assistant"]), "content": _TEXT | _NUMBER}
    ),
    st.fixed_dictionaries(
        {"type": st.just("function_call"), "call_id": _TEXT, "name": _TEXT, "arguments": _TEXT}
    ),
    st.fixed_dictionaries(
        {"type": st.just("function_call_output"), "call_id": _TEXT, "output": _LEAF}
    ),
    st.fixed_dictionaries(
        {
            "type": st.just("reasoning"),
            "summary": st.lists(st.fixed_dictionaries({"text": _TEXT}), max_size=2),
        }
    ),
    st.fixed_dictionaries({"type": st.sampled_from(["item_reference", "", 3]), "id": _TEXT}),
    _NUMBER,
)
_BLOCK = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": _TEXT}),
    st.fixed_dictionaries(
        {
            "type": st.just("tool_use"),
            "id": _TEXT,
            "name": _TEXT,
            "input": st.dictionaries(_TEXT, _LEAF, max_size=2),
        }
    ),
    st.fixed_dictionaries(
        {
            "type": st.just("tool_result"),
            "tool_use_id": _TEXT,
            "content": _LEAF,
            "is_error": st.booleans(),
        }
    ),
    st.fixed_dictionaries({"type": st.just("thinking"), "thinking": _TEXT}),
    _NUMBER,
)
_ANTHROPIC_ITEM = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["user", "assistant", ""]),
        "content": _TEXT | _NUMBER | st.lists(_BLOCK, max_size=3),
    }
)
_ITEMS = {"chat": _CHAT_ITEM, "responses": _RESPONSES_ITEM, "anthropic": _ANTHROPIC_ITEM}
_FIELD = {"chat": "messages", "responses": "input", "anthropic": "messages"}


@st.composite
def request_runs(draw: st.DrawFn) -> tuple[str, list[list[Any]]]:
    """A dialect and a run of requests that mostly extend earlier ones, sometimes rewrite them."""
    dialect = draw(st.sampled_from(sorted(_ITEMS)))
    runs: list[list[Any]] = []
    for _ in range(draw(st.integers(1, 8))):
        extend = draw(st.booleans())
        base = draw(st.sampled_from(runs)) if runs and extend else []
        keep = draw(st.integers(0, len(base)))
        runs.append(base[:keep] + draw(st.lists(_ITEMS[dialect], max_size=4)))
    return dialect, runs


def _outcome(dialect: str, items: list[Any], cache: PrefixCache | None) -> Any:
    try:
        messages = DIALECTS[dialect].parse_request({_FIELD[dialect]: items}, cache).messages
    except DialectError as exc:
        return f"DialectError: {exc}"
    return [(m.id, m.model_dump_json()) for m in messages]


@settings(max_examples=300, deadline=None)
@given(run=request_runs(), lineages=st.integers(1, 4))
def test_a_cached_parse_equals_a_parse_from_scratch(
    run: tuple[str, list[list[Any]]], lineages: int
) -> None:
    dialect, requests = run
    cache = PrefixCache(lineages)
    for items in requests:
        # A fresh decode per request, as the proxy does: nothing is shared with earlier ones.
        items = json.loads(json.dumps(items))
        assert _outcome(dialect, items, cache) == _outcome(dialect, items, None)


@pytest.mark.parametrize(
    ("dialect", "valid", "invalid"),
    [
        ("chat", {"role": "user", "content": "a"}, {"role": ""}),
        ("anthropic", {"role": "user", "content": "a"}, {"role": "user", "content": [3]}),
        ("responses", {"role": "user", "content": "a"}, {"type": "", "id": "x"}),
        ("responses", {"type": "function_call", "name": "f"}, {"type": 3}),
    ],
)
def test_an_invalid_tail_is_reported_as_a_parse_from_scratch_reports_it(
    dialect: str, valid: dict[str, Any], invalid: dict[str, Any]
) -> None:
    cache = PrefixCache()
    field = _FIELD[dialect]
    DIALECTS[dialect].parse_request({field: [valid, valid]}, cache)
    body = {field: [valid, valid, invalid]}
    with pytest.raises(DialectError) as scratch:
        DIALECTS[dialect].parse_request(body)
    with pytest.raises(DialectError) as cached:
        DIALECTS[dialect].parse_request(body, cache)
    assert str(cached.value) == str(scratch.value) and "[2]" in str(scratch.value)
