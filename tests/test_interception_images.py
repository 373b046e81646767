"""Images through the interception in each of its three dialects, over real sockets to the
scripted model: a chat ``image_url`` part, a Responses ``input_image`` and Anthropic ``image``
blocks (a base64 and a url source, and one inside a ``tool_result``) reach the model (its
``images`` policy names each image it was shown) and are recorded in the trace as one chat
``image_url`` part shape, kept by the Parquet table and shown by the viewer."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anthropic
import openai
import pytest

from vfray.interception import Interception, Upstream
from vfray.models.scripted.server import ScriptedModel, scripted_server
from vfray.trace import Message, TaskRecord, Trace
from vfray.traces import table_to_traces, traces_to_table
from vfray.view.rollout import message_html

# A 1x1 red PNG.
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC"
DATA_URL = f"data:image/png;base64,{PNG}"
SEEN = f"image/png, {len(base64.b64decode(PNG))} bytes, sha256 "
SEEN += hashlib.sha256(base64.b64decode(PNG)).hexdigest()[:12]
REMOTE = "https://images.invalid/square.png"
TEXT = {"type": "text", "text": "Which colour?"}
IMAGE = {"type": "image_url", "image_url": {"url": DATA_URL}}


@pytest.fixture(scope="module")
def scripted() -> Iterator[str]:
    with scripted_server(ScriptedModel("images")) as url:
        yield url


@pytest.fixture
async def icpt(scripted: str) -> AsyncIterator[Interception]:
    async with Interception(Upstream(scripted, "upstream-key", model="m")) as i:
        yield i


def _user(trace: Trace) -> Message:
    return next(m for m in trace.graph.values() if m.role == "user")


async def test_an_image_reaches_the_model_and_the_trace_through_each_dialect(
    icpt: Interception,
) -> None:
    traces = {name: Trace(task=TaskRecord(key=name, hash="h")) for name in ("c", "r", "a")}
    key = {name: icpt.app.register(trace) for name, trace in traces.items()}
    chat = openai.AsyncOpenAI(base_url=icpt.url, api_key=key["c"], max_retries=0)
    sent: Any = [{"role": "user", "content": [TEXT, IMAGE]}]
    answer = await chat.chat.completions.create(model="x", messages=sent)
    assert answer.choices[0].message.content == f"image 1: {SEEN}"

    responses = openai.AsyncOpenAI(base_url=icpt.url, api_key=key["r"], max_retries=0)
    part = {"type": "input_image", "image_url": DATA_URL, "detail": "auto"}
    sent = [{"role": "user", "content": [{"type": "input_text", "text": TEXT["text"]}, part]}]
    reply = await responses.responses.create(model="x", input=sent)
    assert reply.output_text == f"image 1: {SEEN}"

    claude = anthropic.AsyncAnthropic(base_url=icpt.root_url, api_key=key["a"], max_retries=0)
    b64: Any = {"type": "base64", "media_type": "image/png", "data": PNG}
    url: Any = {"type": "url", "url": REMOTE}
    shown = [{"type": "image", "source": b64}, {"type": "image", "source": url}]
    use = {"type": "tool_use", "id": "t1", "name": "look", "input": {}}
    result = {"type": "tool_result", "tool_use_id": "t1", "content": shown[:1]}
    sent = [
        {"role": "user", "content": [TEXT, *shown]},
        {"role": "assistant", "content": [use]},
        {"role": "user", "content": [result]},
    ]
    message = await claude.messages.create(model="x", max_tokens=100, messages=sent)
    assert message.content[0].text == f"image 1: {SEEN}\nimage 2: {REMOTE}"  # type: ignore[union-attr]

    # One recorded shape in every dialect: the same image is the same message.
    assert _user(traces["c"]).content == [TEXT, IMAGE]
    assert _user(traces["r"]).id == _user(traces["c"]).id
    remote = {"type": "image_url", "image_url": {"url": REMOTE}}
    assert _user(traces["a"]).content == [TEXT, IMAGE, remote]
    tool = next(m for m in traces["a"].graph.values() if m.role == "tool")
    assert tool.content == [IMAGE] and tool.tool_call_id == "t1"

    # The Parquet table keeps the parts; the viewer shows the inline image and links the remote.
    back = table_to_traces(traces_to_table([traces["a"]]))[0]
    assert _user(back).content == [TEXT, IMAGE, remote]
    html = message_html(_user(back).model_dump(exclude_none=True))
    assert f'<img alt=image style="max-width:100%" src="{DATA_URL}">' in html
    assert f'<a href="{REMOTE}" rel=noreferrer>' in html
