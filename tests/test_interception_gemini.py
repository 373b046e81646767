"""The Gemini dialect: ``generateContent``/``streamGenerateContent`` requests shaped as the
``@google/genai`` SDK (gemini-cli's client) sends them, translated to chat completions for the
scripted model and answered in Gemini's shape; recorded like every other dialect's calls.
gemini-cli itself drives it in tests/test_agent_gemini_cli.py."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from vfray.interception import Interception, Limits, Upstream
from vfray.interception.dialects import DialectError
from vfray.interception.dialects.gemini import GeminiDialect, contents_messages, gemini_method
from vfray.models.scripted.server import ScriptedModel, scripted_server
from vfray.trace import StopCondition, TaskRecord, Trace

MODEL = "imposed-model"
TASK = 'Write "hello agent" to out.txt, then check it.'
SHELL = {
    "functionDeclarations": [
        {
            "name": "run_shell_command",
            "description": "Runs a shell command.",
            "parametersJsonSchema": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        }
    ]
}
SYSTEM = {"role": "user", "parts": [{"text": "You are an interactive CLI agent."}]}


def new_trace() -> Trace:
    return Trace(task=TaskRecord(key="k", hash="h"))


@pytest.fixture(scope="module")
def scripted() -> Iterator[tuple[ScriptedModel, str]]:
    model = ScriptedModel("agent")
    with scripted_server(model) as url:
        yield model, url


@pytest.fixture
async def icpt(scripted: tuple[ScriptedModel, str]) -> AsyncIterator[Interception]:
    async with Interception(Upstream(scripted[1], "upstream-key", model=MODEL)) as i:
        yield i


def _body(contents: list[Any]) -> dict[str, Any]:
    return {
        "contents": contents,
        "systemInstruction": SYSTEM,
        "tools": [SHELL],
        "generationConfig": {"temperature": 0.5, "topP": 0.9, "maxOutputTokens": 200},
    }


def test_contents_become_chat_messages() -> None:
    body = {
        "systemInstruction": {"parts": [{"text": "be brief"}]},
        "contents": [
            {"role": "user", "parts": [{"text": "run "}, {"text": "ls"}]},
            {
                "role": "model",
                "parts": [
                    {"text": "thinking", "thought": True},
                    {"functionCall": {"name": "run_shell_command", "args": {"command": "ls"}}},
                    {"thoughtSignature": "opaque"},
                ],
            },
            {
                "role": "user",
                "parts": [
                    {
                        "functionResponse": {
                            "name": "run_shell_command",
                            "response": {"output": "a.txt"},
                        }
                    }
                ],
            },
        ],
    }
    messages = contents_messages(body)
    assert [(m.role, m.text) for m in messages] == [
        ("system", "be brief"),
        ("user", "run ls"),
        ("assistant", ""),
        ("tool", "a.txt"),
    ]
    (call,) = messages[2].tool_calls or []
    assert call["function"] == {"name": "run_shell_command", "arguments": '{"command":"ls"}'}
    assert messages[2].reasoning_content == "thinking"
    # A call without an id gets one, and its response (matched by name) the same.
    assert messages[3].tool_call_id == call["id"] and messages[3].name == "run_shell_command"


def test_the_upstream_gets_a_chat_request_with_the_eval_sampling() -> None:
    body = _body([{"role": "user", "parts": [{"text": "hi"}]}])
    body["tools"] = [{"functionDeclarations": [{"name": "f", "parameters": {"type": "OBJECT"}}]}]
    body["toolConfig"] = {"functionCallingConfig": {"mode": "ANY"}}
    body["generationConfig"]["responseMimeType"] = "application/json"
    chat = GeminiDialect(stream=True).impose(body, MODEL, {"temperature": 0.0})
    assert chat["model"] == MODEL and chat["stream"] is True
    assert chat["stream_options"] == {"include_usage": True}
    assert chat["messages"][0] == {"role": "system", "content": SYSTEM["parts"][0]["text"]}
    assert chat["tools"] == [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    ]
    assert chat["tool_choice"] == "required"
    assert chat["response_format"] == {"type": "json_object"}
    assert (chat["temperature"], chat["top_p"], chat["max_tokens"]) == (0.0, 0.9, 200)


@pytest.mark.parametrize(
    "contents, message",
    [
        ("hi", "'contents' must be a list"),
        ([{"role": "user", "parts": "hi"}], r"contents\[0\].parts must be a list"),
        ([{"role": "user", "parts": [{"fileData": {}}]}], "unsupported part"),
    ],
)
def test_malformed_contents_say_where(contents: Any, message: str) -> None:
    with pytest.raises(DialectError, match=message):
        GeminiDialect().parse_request({"contents": contents})


def test_gemini_routes() -> None:
    assert gemini_method("/v1beta/models/gemini-2.5-pro:streamGenerateContent") == (
        "streamGenerateContent"
    )
    assert gemini_method("/v1beta/models/x:generateContent") == "generateContent"
    assert gemini_method("/v1beta/models/x:embedContent") is None
    assert gemini_method("/v1/chat/completions") is None


def _events(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]


async def _call(
    http: httpx.AsyncClient, key: str, contents: list[Any], stream: bool
) -> dict[str, Any]:
    """One call as the genai SDK makes it; returns the answer merged into one response."""
    method = "streamGenerateContent?alt=sse" if stream else "generateContent"
    response = await http.post(
        f"/v1beta/models/gemini-2.5-pro:{method}",
        json=_body(contents),
        headers={"x-goog-api-key": key},
    )
    assert response.status_code == 200, response.text
    if not stream:
        answer: dict[str, Any] = response.json()
        return answer
    assert response.headers["content-type"].startswith("text/event-stream")
    chunks = _events(response.text)
    parts = [p for c in chunks for p in c["candidates"][0]["content"]["parts"]]
    # Text comes in pieces (the SDK's .text joins them), tool calls whole in the last chunk.
    text = "".join(p["text"] for p in parts if "text" in p)
    parts = [{"text": text}] * bool(text) + [p for p in parts if "text" not in p]
    last = chunks[-1]
    last["candidates"][0]["content"]["parts"] = parts
    return last


@pytest.mark.parametrize("stream", [False, True])
async def test_a_tool_loop_through_the_dialect(
    icpt: Interception, scripted: tuple[ScriptedModel, str], stream: bool
) -> None:
    trace = new_trace()
    key = icpt.app.register(trace)
    contents: list[Any] = [{"role": "user", "parts": [{"text": TASK}]}]
    async with httpx.AsyncClient(base_url=icpt.root_url, timeout=30) as http:
        for _ in range(3):
            answer = await _call(http, key, contents, stream)
            (candidate,) = answer["candidates"]
            assert candidate["finishReason"] == "STOP"
            assert answer["usageMetadata"]["promptTokenCount"] > 0
            content = candidate["content"]
            assert content["role"] == "model"
            contents.append(content)
            calls = [p["functionCall"] for p in content["parts"] if "functionCall" in p]
            if not calls:
                break
            # gemini-cli sends each call back with its id, and answers it by that id.
            (call,) = calls
            assert call["name"] == "run_shell_command" and call["id"]
            output = {"output": "hello agent\n"}
            reply = {"id": call["id"], "name": call["name"], "response": output}
            contents.append({"role": "user", "parts": [{"functionResponse": reply}]})
    # Write, check, answer: and the scripted model got chat completions with the shell tool.
    assert [len(c["parts"]) for c in contents[1::2]] == [1, 1, 1] and len(trace.calls) == 3
    sent = scripted[0].history[-1]
    assert sent.route.endswith("/chat/completions") and sent.body["model"] == MODEL
    assert sent.body["tools"][0]["function"]["name"] == "run_shell_command"
    # Recorded as the other dialects are: one branch growing, the chat shape, gemini's name.
    assert len(trace.branch_list) == 1
    assert all(c.dialect == "gemini" and c.error is None for c in trace.calls)
    assert all(c.streamed is stream for c in trace.calls)
    assert trace.calls[0].sampling == {"max_tokens": 200, "temperature": 0.5, "top_p": 0.9}
    roles = [trace.graph[i].role for i in trace.calls[-1].request_ids]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "tool"]
    assert trace.last_reply and contents[-1]["parts"] == [{"text": trace.last_reply}]


async def test_refusals_are_gemini_errors(icpt: Interception) -> None:
    trace = new_trace()
    key = icpt.app.register(trace, Limits(max_turns=1))
    contents = [{"role": "user", "parts": [{"text": TASK}]}]
    path = "/v1beta/models/m:generateContent"
    async with httpx.AsyncClient(base_url=icpt.root_url, timeout=30) as http:
        # The key as the ?key= query parameter works as well as the header.
        first = await http.post(path, params={"key": key}, json=_body(contents))
        assert first.status_code == 200, first.text
        refused = await http.post(path, params={"key": key}, json=_body(contents * 2))
        unknown = await http.post(path, params={"key": "nope"}, json=_body(contents))
        bad = await http.post(path, params={"key": key}, json={"contents": "hi"})
        no_method = await http.post("/v1beta/models/m:embedContent", params={"key": key})
    # gemini-cli gives up at once on a 403, and retries 429/5xx.
    assert refused.status_code == 403 and refused.headers["x-should-retry"] == "false"
    error = refused.json()["error"]
    assert error["status"] == "PERMISSION_DENIED" and "max_turns" in error["message"]
    assert unknown.status_code == 403 and unknown.json()["error"]["code"] == 403
    assert bad.status_code == 400 and bad.json()["error"]["status"] == "INVALID_ARGUMENT"
    assert no_method.status_code == 404
    assert trace.stop_condition is StopCondition.MAX_TURNS and len(trace.calls) == 1


async def test_an_upstream_error_is_answered_in_gemini_shape(
    icpt: Interception, scripted: tuple[ScriptedModel, str]
) -> None:
    trace = new_trace()
    contents = [{"role": "user", "parts": [{"text": TASK}]}]
    headers = {"x-goog-api-key": icpt.app.register(trace)}
    scripted[0].fail_next(400)
    async with httpx.AsyncClient(base_url=icpt.root_url, timeout=30) as http:
        response = await http.post(
            "/v1beta/models/m:generateContent", json=_body(contents), headers=headers
        )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == 400 and error["status"] == "INVALID_ARGUMENT" and error["message"]
    assert trace.calls[0].error is not None


async def test_count_tokens_is_an_estimate_not_a_call(icpt: Interception) -> None:
    """gemini-cli counts a prompt with media (falling back to its own estimate on an error)."""
    trace = new_trace()
    key = icpt.app.register(trace)
    contents = [{"role": "user", "parts": [{"text": "x" * 400}]}]
    path = "/v1beta/models/m:countTokens"
    async with httpx.AsyncClient(base_url=icpt.root_url, timeout=30) as http:
        counted = await http.post(
            path, json={"contents": contents}, headers={"x-goog-api-key": key}
        )
        bad = await http.post(path, json={"contents": "x"}, headers={"x-goog-api-key": key})
        unknown = await http.post(path, json={"contents": contents}, params={"key": "nope"})
    # One token per 4 bytes of the contents' compact JSON, rounded up: it errs high.
    assert counted.status_code == 200 and 100 < counted.json()["totalTokens"] < 120
    assert bad.status_code == 400 and bad.json()["error"]["status"] == "INVALID_ARGUMENT"
    assert unknown.status_code == 403
    assert trace.calls == [] and trace.notes == []
