"""vfray.interception's budgets and token counts below the proxy: which limit a trace has
reached (input tokens per branch, output summed, the fields' order), the count estimate, and
``TokenCounter`` against a real upstream on loopback that answers a count, has no such route,
refuses the request, fails, or answers nonsense; which token ids of an answer are kept.
tests/test_interception*.py drive the proxy."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from vfray.endpoints.serving import serve_in_loop
from vfray.interception.count_tokens import TokenCounter, estimate
from vfray.interception.dialects.chat import ChatDialect
from vfray.interception.limits import Limits, input_tokens, output_tokens
from vfray.interception.upstream import Forwarder, Upstream
from vfray.trace import Message, StopCondition, TaskRecord, Trace, Usage

# --- limits -------------------------------------------------------------------------------------


def _trace(*calls: tuple[str, int, int]) -> Trace:
    """Calls as (branch tag, input tokens, output tokens); a new tag starts a new branch."""
    trace = Trace(task=TaskRecord(key="k", hash="h"))
    history: dict[str, list[Message]] = {}
    for tag, used_in, used_out in calls:
        messages = history.setdefault(tag, [Message(role="user", content=f"start {tag}")])
        reply = Message(role="assistant", content=f"reply {len(trace.calls)}")
        trace.record_call(
            list(messages), reply, usage=Usage(input_tokens=used_in, output_tokens=used_out)
        )
        messages += [reply, Message(role="user", content="go on")]
    return trace


def test_input_tokens_are_each_branchs_largest_prompt_summed() -> None:
    trace = _trace(("a", 100, 10), ("a", 150, 5), ("b", 80, 1), ("a", 120, 2))
    assert len(trace.branch_list) == 2
    assert input_tokens(trace) == 150 + 80  # a branch's last prompt holds its earlier ones
    assert output_tokens(trace) == 18
    assert (input_tokens(_trace()), output_tokens(_trace())) == (0, 0)


@pytest.mark.parametrize(
    ("limits", "reached"),
    [
        (Limits(), None),
        (Limits(max_turns=3), StopCondition.MAX_TURNS),
        (Limits(max_turns=4), None),
        (Limits(max_input_tokens=230), StopCondition.MAX_INPUT_TOKENS),
        (Limits(max_input_tokens=231), None),
        (Limits(max_output_tokens=16), StopCondition.MAX_OUTPUT_TOKENS),
        (Limits(max_total_tokens=246), StopCondition.MAX_TOTAL_TOKENS),
        (Limits(max_total_tokens=247), None),
        # Several reached: the first in the fields' order says why.
        (Limits(max_turns=1, max_output_tokens=1), StopCondition.MAX_TURNS),
        (Limits(max_input_tokens=1, max_total_tokens=1), StopCondition.MAX_INPUT_TOKENS),
        (Limits(max_output_tokens=1, max_total_tokens=1), StopCondition.MAX_OUTPUT_TOKENS),
        # A user-turn budget is the rollout's to count, never a model call's.
        (Limits(max_user_turns=0), None),
    ],
)
def test_the_first_limit_reached_stops_the_rollout(
    limits: Limits, reached: StopCondition | None
) -> None:
    trace = _trace(("a", 100, 10), ("a", 150, 5), ("b", 80, 1))  # 230 in, 16 out, 3 turns
    assert limits.reached(trace) is reached


def test_limits_are_non_negative_and_frozen() -> None:
    with pytest.raises(ValidationError):
        Limits(max_turns=-1)
    limits = Limits(max_turns=1)
    with pytest.raises(ValidationError):
        limits.max_turns = 2  # type: ignore[misc]
    assert Limits(max_turns=0).reached(_trace()) is StopCondition.MAX_TURNS


# --- token counts -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "tokens"),
    [
        ({}, 1),  # never 0
        ({"model": "m" * 400, "max_tokens": 10}, 1),  # only system, messages, tools count
        ({"system": "abcd"}, 5),  # {"system":"abcd"}: 17 bytes
        ({"system": "éééé"}, 6),  # as long as "abcd" but 21 UTF-8 bytes
        ({"system": None, "tools": []}, 3),  # {"tools":[]}: 12 bytes
    ],
)
def test_the_estimate_is_a_quarter_of_the_counted_fields_json_bytes(
    body: dict[str, Any], tokens: int
) -> None:
    assert estimate(body) == tokens


class Upstream_:
    """An upstream whose count route answers ``replies`` in turn; it records what it got."""

    def __init__(self, *replies: tuple[int, bytes]) -> None:
        self.replies = list(replies)
        self.seen: list[tuple[dict[str, Any], dict[str, str]]] = []

    async def count(self, request: Request) -> Response:
        self.seen.append((json.loads(await request.body()), dict(request.headers)))
        status, body = self.replies.pop(0)
        return Response(body, status, media_type="application/json")

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/v1/messages/count_tokens", self.count, methods=["POST"])])


BODY = {"model": "client-model", "messages": [{"role": "user", "content": "hi"}]}
ESTIMATE = estimate(BODY)


async def _counts(upstream: Upstream_, requests: int) -> AsyncIterator[tuple[int, Any, Any]]:
    async with serve_in_loop(upstream.app()) as url:
        forwarder = Forwarder(Upstream(f"{url}/v1", "sk-upstream", model="served-model"))
        counter = TokenCounter(forwarder)
        try:
            for _ in range(requests):
                response = await counter.answer(dict(BODY), {"anthropic-beta": "b1", "x": "y"})
                yield (
                    response.status_code,
                    json.loads(bytes(response.body)),
                    counter.upstream_serves,
                )
        finally:
            await forwarder.aclose()


async def _all(upstream: Upstream_, requests: int) -> list[tuple[int, Any, Any]]:
    return [item async for item in _counts(upstream, requests)]


async def test_a_count_the_upstream_serves_is_forwarded_with_its_model_and_key() -> None:
    upstream = Upstream_((200, b'{"input_tokens": 7}'), (200, b'{"input_tokens": 9}'))
    assert await _all(upstream, 2) == [
        (200, {"input_tokens": 7}, True),
        (200, {"input_tokens": 9}, True),
    ]
    body, headers = upstream.seen[0]
    assert body["model"] == "served-model" and body["messages"] == BODY["messages"]
    assert headers["x-api-key"] == "sk-upstream" and headers["anthropic-beta"] == "b1"
    assert "x" not in headers and "authorization" not in headers


@pytest.mark.parametrize("status", [404, 405, 501])
async def test_an_upstream_without_the_route_is_estimated_from_then_on(status: int) -> None:
    upstream = Upstream_((status, b'{"error": "no such route"}'))
    assert await _all(upstream, 3) == [(200, {"input_tokens": ESTIMATE}, False)] * 3
    assert len(upstream.seen) == 1  # asked once, never again


async def test_the_clients_own_error_is_passed_through() -> None:
    error = b'{"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}'
    upstream = Upstream_((400, error), (200, b'{"input_tokens": 3}'))
    first, second = await _all(upstream, 2)
    assert first == (400, json.loads(error), None)  # says nothing about the route
    assert second == (200, {"input_tokens": 3}, True)


@pytest.mark.parametrize(
    "reply",
    [
        (503, b'{"error": "overloaded"}'),
        (302, b""),
        (200, b"not json"),
        (200, b'{"input_tokens": -1}'),
        (200, b'{"input_tokens": true}'),
        (200, b'{"input_tokens": "7"}'),
        (200, b'{"tokens": 7}'),
        (200, b"[1, 2]"),
    ],
)
async def test_a_failing_or_nonsense_answer_is_estimated_for_that_request_only(
    reply: tuple[int, bytes],
) -> None:
    upstream = Upstream_(reply, (200, b'{"input_tokens": 5}'))
    first, second = await _all(upstream, 2)
    assert first == (200, {"input_tokens": ESTIMATE}, None)
    assert second == (200, {"input_tokens": 5}, True)  # the next request is forwarded again


async def test_an_unreachable_upstream_is_estimated() -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    forwarder = Forwarder(Upstream(f"http://127.0.0.1:{port}/v1", model="m"))
    try:
        response = await TokenCounter(forwarder).answer(dict(BODY), {})
    finally:
        await forwarder.aclose()
    assert json.loads(bytes(response.body)) == {"input_tokens": ESTIMATE}


# --- token ids in an answer ---------------------------------------------------------------------


def test_an_answers_token_ids_are_kept_only_when_every_entry_is_an_int() -> None:
    def answer(prompt_ids: Any) -> dict[str, Any]:
        message = {"role": "assistant", "content": "ok"}
        choice = {"message": message, "finish_reason": "stop", "token_ids": [7, 8]}
        return {"choices": [choice], "prompt_token_ids": prompt_ids}

    sent = [1, 2, 3]
    parsed = ChatDialect().parse_response(answer(sent))
    assert parsed.prompt_token_ids == [1, 2, 3] and parsed.prompt_token_ids is not sent
    assert parsed.completion_token_ids == [7, 8]
    # JSON true is 1 to Python's isinstance: it is no token id, nor are 2.0, "2" or null.
    for bad in ([1, True], [1, 2.0], [1, "2"], [1, None], "1 2", {"ids": [1]}):
        assert ChatDialect().parse_response(answer(bad)).prompt_token_ids is None, bad
