"""A reply an agent sends back with its tool-call arguments re-serialized (goose writes
``{"command":"ls"}`` for the model's ``{"command": "ls"}``) is the reply: the call extends its
branch. Any other change still starts a new branch; with token-in the call goes as token ids."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
from test_token_in import BASH_TOOL, model_dir, template  # noqa: F401 - fixtures

from vfray.endpoints.chat_template import ChatTemplate
from vfray.interception import Interception, Upstream
from vfray.interception.resent import as_replied
from vfray.interception.settings import InterceptionSettings
from vfray.models.scripted.server import ScriptedModel, scripted_server
from vfray.trace import Message, TaskRecord, Trace

SYSTEM = Message(role="system", content="s")
USER = Message(role="user", content="u")


def _assistant(arguments: str, call_id: str = "c1", content: Any = None) -> Message:
    function = {"name": "shell", "arguments": arguments}
    call = {"id": call_id, "type": "function", "function": function}
    return Message(role="assistant", content=content, tool_calls=[call])


def _branches(resent: Message) -> list[list[int]]:
    trace = Trace(task=TaskRecord(key="k", hash="h", data={}))
    trace.record_call([SYSTEM, USER], _assistant('{"command": "ls", "n": 1}'))
    tool = Message(role="tool", content="out", tool_call_id="c1")
    request = as_replied(trace, [SYSTEM, USER, resent, tool])
    trace.record_call(request, Message(role="assistant", content="done"))
    return [b.call_indices for b in trace.branch_list]


def test_a_reply_sent_back_respelled_extends_its_branch() -> None:
    assert _branches(_assistant('{"n":1,"command":"ls"}')) == [[0, 1]]
    assert _branches(_assistant('{"command": "ls", "n": 1}')) == [[0, 1]]  # as it was sent


def test_a_changed_reply_starts_a_new_branch() -> None:
    assert _branches(_assistant('{"command":"pwd","n":1}')) == [[0], [1]]
    assert _branches(_assistant('{"command":"ls","n":1}', call_id="c2")) == [[0], [1]]
    assert _branches(_assistant('{"command":"ls","n":1}', content="hm")) == [[0], [1]]
    assert _branches(_assistant("not json")) == [[0], [1]]


async def test_token_in_finds_the_branch_of_a_respelled_reply(
    template: ChatTemplate,  # noqa: F811 - the fixture
    model_dir: Path,  # noqa: F811 - the fixture
) -> None:
    """Through the interception with token-in: the second call goes as token ids on the first
    call's branch (without the mapping: as messages, on a branch of its own)."""
    scripted = ScriptedModel("bash", chat_template=template)
    with scripted_server(scripted) as url:
        upstream = Upstream(url, model="m", sampling={"return_tokens": True})
        settings = InterceptionSettings(token_in=True, tokenizer=str(model_dir))
        async with Interception(upstream, settings=settings) as icpt:
            trace = Trace(task=TaskRecord(key="k", hash="h"))
            secret = icpt.app.register(trace)
            client = openai.AsyncOpenAI(base_url=icpt.url, api_key=secret, max_retries=0)
            messages: list[Any] = [{"role": "user", "content": "run: ls -la"}]
            reply = await client.chat.completions.create(
                model="x", messages=messages, tools=[BASH_TOOL]
            )
            message = reply.choices[0].message.model_dump(exclude_none=True)
            function = message["tool_calls"][0]["function"]
            assert function["arguments"] == '{"command": "ls -la"}'
            function["arguments"] = '{"command":"ls -la"}'  # as goose sends it back
            messages.append(message)
            tool_call_id = message["tool_calls"][0]["id"]
            messages.append({"role": "tool", "tool_call_id": tool_call_id, "content": "a b"})
            await client.chat.completions.create(model="x", messages=messages, tools=[BASH_TOOL])
            trace = icpt.app.conclude(secret)
    assert scripted.history[-1].route == "/v1/chat/completions/tokens"
    assert [b.call_indices for b in trace.branch_list] == [[0, 1]]
