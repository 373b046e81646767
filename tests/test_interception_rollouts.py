"""The interception under rollouts: a slow sync ``@stop`` hook stalls only its own session, and
what goes wrong on either side of the proxy lands on the trace as the right error class
(real rollouts: the built-in chat-loop harness in the subprocess runtime)."""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

import vfray as vf
from vfray.config import load_config
from vfray.endpoints.serving import serve_in_loop
from vfray.harnesses.base import Harness, LaunchContext
from vfray.harnesses.chat import openai_base_url
from vfray.harnesses.registry import register_harness
from vfray.interception import Interception, Upstream
from vfray.models.scripted.server import scripted_server
from vfray.run.driver import RETRYABLE
from vfray.run.spec import resolve_run
from vfray.runtimes.base import ProgramResult, Runtime
from vfray.scoring import check_stop
from vfray.trace import TaskRecord, Trace

# Retried by the farm: at once (RETRYABLE), or after a backoff (a ProviderError).
RETRIED = RETRYABLE | {"ProviderError"}


@pytest.fixture(scope="module")
def echo_url() -> Iterator[str]:
    with scripted_server("echo") as url:
        yield url


@pytest.fixture
async def icpt(echo_url: str) -> AsyncIterator[Interception]:
    async with Interception(Upstream(echo_url, model="m")) as i:
        yield i


def new_trace() -> Trace:
    return Trace(task=TaskRecord(key="k", hash="h"))


# -- stop hooks off the loop --------------------------------------------------------------------


class SlowStopTask(vf.Task[vf.TaskData]):
    """Its sync stop hook blocks until the test releases it (or 10 s pass)."""

    entered = threading.Event()
    release = threading.Event()
    released: list[bool] = []

    @vf.stop
    def slow(self, trace: vf.Trace) -> bool:
        self.entered.set()
        self.released.append(self.release.wait(timeout=10))
        return False


async def test_a_slow_sync_stop_hook_does_not_stall_other_sessions(icpt: Interception) -> None:
    slow_task = SlowStopTask(vf.TaskData(prompt="p"))
    slow_trace, fast_trace = new_trace(), new_trace()

    def stop_check(trace: Trace) -> Any:
        return check_stop(slow_task, trace)

    slow = icpt.app.register(slow_trace, stop_check=stop_check)
    fast = icpt.app.register(fast_trace)
    body = {"messages": [{"role": "user", "content": "hi"}]}
    async with httpx.AsyncClient(base_url=icpt.url, timeout=60) as http:
        slow_call = asyncio.create_task(
            http.post("/chat/completions", json=body, headers={"authorization": f"Bearer {slow}"})
        )
        # Inline on the loop, the hook would hold this await (and everything else) until its
        # own 10 s timeout.
        assert await asyncio.to_thread(SlowStopTask.entered.wait, 10)
        for turn in range(3):
            reply = await http.post(
                "/chat/completions",
                json={"messages": [{"role": "user", "content": f"turn {turn}"}]},
                headers={"authorization": f"Bearer {fast}"},
            )
            assert reply.status_code == 200
        # The other session finished three turns while the hook was still blocked.
        assert not slow_call.done() and SlowStopTask.released == []
        SlowStopTask.release.set()
        assert (await slow_call).status_code == 200
    assert SlowStopTask.released == [True]
    assert len(fast_trace.calls) == 3 and len(slow_trace.calls) == 1


# -- error classes on real rollouts -------------------------------------------------------------


async def _not_json(request: Request) -> Response:
    await request.body()
    return Response(b'{"choices": [{"message": ', media_type="application/json")


def chat_env(**options: Any) -> vf.LocalEnvironment:
    options.setdefault("model", "scripted:echo")
    return vf.LocalEnvironment(
        harness="null",
        runtime="subprocess",
        harness_options={"retries": 1, "extra_args": ["--backoff", "0.05"]},
        **options,
    )


async def test_unreadable_upstream_reply_is_a_retryable_provider_error() -> None:
    model = Starlette(routes=[Route("/v1/chat/completions", _not_json, methods=["POST"])])
    async with serve_in_loop(model) as url, chat_env(model="m", base_url=f"{url}/v1") as env:
        trace = await env.rollout(vf.Task(vf.TaskData(prompt="hello")))
    first = trace.error()
    assert first is not None and first.type == "ProviderError", trace.errors
    assert "unreadable reply" in first.message
    assert first.type in RETRIED
    # Both attempts reached the model and were recorded as the provider's failures.
    assert len(trace.calls) == 2
    assert all(c.error is not None and c.error.type == "ProviderError" for c in trace.calls)


async def test_prompt_over_the_body_cap_is_a_413_on_the_trace_not_a_reset() -> None:
    # The cap as configured (interception.max_body_bytes) reaches the local backend's proxy.
    overrides = {
        "backend": "local",
        "model.name": "scripted:echo",
        "env.harness.id": "null",
        "env.harness.options": {"retries": 1, "extra_args": ["--backoff", "0.05"]},
        "interception.max_body_bytes": 2_000_000,
    }
    prompt = "x" * 2_500_000
    async with vf.LocalEnvironment(spec=resolve_run(load_config(overrides=overrides))) as env:
        trace = await env.rollout(vf.Task(vf.TaskData(prompt=prompt)))
    first = trace.error()
    assert first is not None and first.type == "HarnessError", trace.errors
    assert first.type not in RETRIED
    assert "HTTP 413" in first.message and "exceeds the 2000000-byte limit" in first.message
    assert "retrying" not in first.message and "reset" not in first.message
    assert any("refused a call as bad input: HTTP 413" in note for note in trace.notes)
    assert trace.calls == []


RAW_POST = r"""
import os, sys, urllib.error, urllib.request
request = urllib.request.Request(
    os.environ["VFRAY_BASE_URL"] + "/chat/completions",
    data=os.environ["RAW_BODY"].encode(),
    headers={"Authorization": "Bearer " + os.environ["VFRAY_API_KEY"]},
)
try:
    urllib.request.urlopen(request, timeout=30)
except urllib.error.HTTPError as exc:
    print("HTTP", exc.code, exc.read().decode(), file=sys.stderr)
    sys.exit(2)
"""


@register_harness
class RawBodyHarness(Harness):
    """An agent that sends one request body exactly as given (bytes a JSON library would not
    produce), for input the interception must refuse."""

    id = "test_raw_body"
    NEEDS_CONTAINER = False

    async def launch(self, ctx: LaunchContext, runtime: Runtime) -> ProgramResult:
        env = {
            "VFRAY_BASE_URL": openai_base_url(ctx.endpoint),
            "VFRAY_API_KEY": ctx.secret,
            "RAW_BODY": ctx.data.prompt_text,
        }
        return await runtime.run_program([sys.executable, "-c", RAW_POST], env, timeout=ctx.timeout)


async def test_lone_surrogate_in_the_agents_json_is_a_400_on_the_trace() -> None:
    raw = r'{"model": "m", "messages": [{"role": "user", "content": "bad \ud800 text"}]}'
    async with vf.LocalEnvironment(harness=RawBodyHarness.id, runtime="subprocess") as env:
        trace = await env.rollout(vf.Task(vf.TaskData(prompt=raw)))
    first = trace.error()
    assert first is not None and first.type == "HarnessError", trace.errors
    assert first.type not in RETRIED
    assert "HTTP 400" in first.message and "lone UTF-16 surrogate" in first.message
    assert any("lone UTF-16 surrogate" in note for note in trace.notes)
    assert trace.calls == []
