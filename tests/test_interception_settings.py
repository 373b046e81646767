"""The interception's bounds from the config tree (``interception.*``), each against real
sockets on 127.0.0.1: a body that stops midway is a 408, not a hang; a non-streamed call slower
than ``upstream_timeout`` is a 504; a stream is bounded by its silences, not its length; a
silent stream gets ``: keepalive`` comments; the body cap is the configured one.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import openai
import pytest

from vfray.config import load_config
from vfray.interception import Interception, InterceptionSettings, Upstream
from vfray.interception.exchange import Exchange
from vfray.models.scripted.server import scripted_server
from vfray.run.environment import LocalEnvironment
from vfray.run.spec import resolve_run
from vfray.trace import TaskRecord, Trace

USER: Any = {"role": "user", "content": "hello there"}


def new_trace() -> Trace:
    return Trace(task=TaskRecord(key="k", hash="h"))


async def test_a_body_that_stops_midway_is_a_408_not_a_hang() -> None:
    with scripted_server("echo") as url:
        settings = InterceptionSettings(body_timeout=0.5)
        async with Interception(Upstream(url, model="m"), settings=settings) as icpt:
            trace = new_trace()
            secret = icpt.app.register(trace)
            reader, writer = await asyncio.open_connection(
                icpt.host, int(icpt.root_url.rsplit(":", 1)[1])
            )
            writer.write(
                b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                + f"authorization: Bearer {secret}\r\n".encode()
                + b"content-type: application/json\r\ncontent-length: 1000\r\n\r\n"
                + b'{"model": "m", "messages": [{"role": "us'
            )
            await writer.drain()
            # Far longer than body_timeout: a hang fails here instead of hanging the suite.
            answer = await asyncio.wait_for(reader.read(), 30)
            writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), answer
    assert b"connection: close" in head.lower()
    assert "the request body stalled: no bytes for 0.5 s" in json.loads(body)["error"]["message"]
    assert not trace.calls  # never forwarded
    assert any("HTTP 408" in note for note in trace.notes), trace.notes


async def test_a_call_slower_than_upstream_timeout_is_a_504() -> None:
    with scripted_server("echo", latency=2.0) as url:
        settings = InterceptionSettings(upstream_timeout=0.3)
        async with Interception(Upstream(url, model="m"), settings=settings) as icpt:
            trace = new_trace()
            client = openai.AsyncOpenAI(
                base_url=icpt.url, api_key=icpt.app.register(trace), max_retries=0
            )
            with pytest.raises(openai.APIStatusError) as failed:
                await client.chat.completions.create(model="x", messages=[USER])
    assert failed.value.status_code == 504
    error = trace.calls[0].error
    assert error is not None and "no answer within 0.3 s (interception.upstream_timeout)" in (
        error.message
    )


async def test_a_stream_is_bounded_by_its_silences_not_its_length() -> None:
    # The stream stalls 1 s after its first event: longer than upstream_timeout, which bounds
    # only plain calls, and shorter than stream_idle_timeout.
    with scripted_server("echo", stall=1.0) as url:
        settings = InterceptionSettings(upstream_timeout=0.3, stream_idle_timeout=5.0)
        async with Interception(Upstream(url, model="m"), settings=settings) as icpt:
            trace = new_trace()
            client = openai.AsyncOpenAI(
                base_url=icpt.url, api_key=icpt.app.register(trace), max_retries=0
            )
            stream = await client.chat.completions.create(model="x", messages=[USER], stream=True)
            text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert "hello there" in text
    assert trace.calls[0].error is None

    with scripted_server("echo", stall=2.0) as url:
        settings = InterceptionSettings(stream_idle_timeout=0.3, sse_keepalive=0)
        async with Interception(Upstream(url, model="m"), settings=settings) as icpt:
            trace = new_trace()
            client = openai.AsyncOpenAI(
                base_url=icpt.url, api_key=icpt.app.register(trace), max_retries=0
            )
            stream = await client.chat.completions.create(model="x", messages=[USER], stream=True)
            # Cut after its first event: the SDK sees the stream end early, without [DONE].
            text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert "hello there" not in text
    error = trace.calls[0].error
    assert error is not None and "silent for 0.3 s (interception.stream_idle_timeout)" in (
        error.message
    )


async def test_a_silent_stream_gets_keepalive_comments() -> None:
    with scripted_server("echo", stall=1.5) as url:
        settings = InterceptionSettings(sse_keepalive=0.2)
        async with Interception(Upstream(url, model="m"), settings=settings) as icpt:
            trace = new_trace()
            secret = icpt.app.register(trace)
            body = {"model": "x", "messages": [USER], "stream": True}
            async with httpx.AsyncClient(timeout=30) as http:
                answer = await http.post(
                    f"{icpt.url}/chat/completions",
                    json=body,
                    headers={"authorization": f"Bearer {secret}"},
                )
    raw = answer.content
    assert answer.status_code == 200
    assert raw.count(b": keepalive\n\n") >= 3, raw  # ~7 in 1.5 s of silence
    # Only between events: every block is a comment or a whole data event.
    blocks = [b for b in raw.split(b"\n\n") if b]
    assert all(b == b": keepalive" or b.startswith(b"data: ") for b in blocks), blocks
    assert raw.rstrip().endswith(b"data: [DONE]")
    assert trace.calls[0].error is None and trace.calls[0].streamed


async def test_keepalive_comments_come_only_after_silence() -> None:
    """The exchange's one silence timer: chunks arriving more often than the keepalive get no
    comment between them (the timer moves on without firing a comment), a silence gets one per
    keepalive, and a chunk after it starts the count again."""
    exchange = Exchange(b"", stream=True)
    exchange.start(200, {})
    got: list[tuple[float, bytes]] = []
    loop = asyncio.get_running_loop()
    start = loop.time()

    async def read() -> None:
        async for chunk in exchange.iter_chunks(0.2, b"#"):
            got.append((loop.time() - start, chunk))

    reader = asyncio.ensure_future(read())
    for i in range(8):  # 0.8 s of chunks every 0.1 s
        exchange.push(b"%d" % i)
        await asyncio.sleep(0.1)
    await asyncio.sleep(0.55)  # then silence: comments at ~1.0 and ~1.2 (and ~1.4)
    exchange.push(b"end")
    await asyncio.sleep(0.1)
    exchange.finish()
    await asyncio.wait_for(reader, 5)
    chunks = [c for _, c in got]
    first_comment = chunks.index(b"#")
    assert chunks[:first_comment] == [b"%d" % i for i in range(8)], chunks
    assert 2 <= chunks.count(b"#") <= 3 and chunks[-1] == b"end", chunks
    assert got[first_comment][0] >= 0.85  # 0.2 s after the last chunk (at ~0.7 s), not before


async def test_the_body_cap_comes_from_the_config() -> None:
    config = load_config(overrides={"interception.max_body_bytes": 4096, "backend": "local"})
    config.model.name = "scripted:echo"
    spec = resolve_run(config)
    async with LocalEnvironment(spec=spec) as env:
        app = env.interception.app
        assert app.settings == config.interception and app.max_body_bytes == 4096
        secret = app.register(new_trace())
        big = {"model": "x", "messages": [{"role": "user", "content": "x" * 5000}]}
        async with httpx.AsyncClient(timeout=30) as http:
            answer = await http.post(
                f"{env.interception.url}/chat/completions",
                json=big,
                headers={"authorization": f"Bearer {secret}"},
            )
    assert answer.status_code == 413
    assert "4096-byte limit" in answer.text
