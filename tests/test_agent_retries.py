"""Retry coalescing with the real agent programs: Claude Code and mini-swe-agent re-send a request
that timed out on their side with ``x-stainless-retry-count: 0``, and Codex re-sends a stream
that went idle (no retry header, the body's ``client_metadata`` keys in a fresh order); the
interception joins or replays the call, so the trace holds one ModelCall per turn however many
times each was sent.

The model takes 4 s per call (Codex: its stream stalls 4 s after the first event) and each agent
gives up after 1.5 s, so every turn is sent several times. A pass-through spy on the interception
app counts what the agents sent (it changes nothing). Skipped with the reason when a registry is
offline.
"""

from __future__ import annotations

from typing import Any

import pytest
from agent_tools import need_registry

import vfray as vf
from vfray.harnesses import make_harness
from vfray.harnesses.provisioned import ProvisionedHarness
from vfray.interception.app import RETRY_HEADER, InterceptionApp
from vfray.runtimes.base import Runtime
from vfray.runtimes.provision import ensure_tool

PROMPT = 'Write "hello agent" to out.txt, then check it.'


class WriteFile(vf.Task[vf.TaskData]):
    @vf.reward
    async def wrote_it(self, runtime: Runtime) -> bool:
        return (await runtime.read("out.txt")) == b"hello agent\n"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("harness_id", "registry", "route", "model", "options"),
    [
        (
            "claude-code",
            "npm",
            "/v1/messages",
            "scripted:agent?latency=4",
            {"env": {"API_TIMEOUT_MS": "1500"}},
        ),
        # The SDK's own retries off: mini-swe-agent's retry loop (a fresh litellm call, count 0).
        (
            "mini-swe-agent",
            "pypi",
            "/v1/chat/completions",
            "scripted:agent?latency=4",
            {
                "extra_args": [
                    *("-c", "model.model_kwargs.timeout=1.5"),
                    *("-c", "model.model_kwargs.max_retries=0"),
                ],
                "model_retries": 6,
            },
        ),
        # Codex's idle timeout runs between stream events only (it waits for a head as long as
        # it takes), so the model sends the head and first event, then stalls past it; Codex
        # then retries the turn's stream with the same body.
        (
            "codex",
            "npm",
            "/v1/responses",
            "scripted:agent?stall=4",
            {"extra_args": ["-c", "model_providers.vfray.stream_idle_timeout_ms=1500"]},
        ),
    ],
)
async def test_real_agents_retries_marked_zero_are_one_call_each(
    monkeypatch: pytest.MonkeyPatch,
    harness_id: str,
    registry: str,
    route: str,
    model: str,
    options: dict[str, Any],
) -> None:
    need_registry(registry)
    harness = make_harness(harness_id)
    assert isinstance(harness, ProvisionedHarness)
    ensure_tool(harness.tool_spec(), harness.tools_root)
    sent: list[str | None] = []
    serve = InterceptionApp.__call__

    async def spy(self: InterceptionApp, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == route:
            headers = dict(scope["headers"])
            value = headers.get(RETRY_HEADER.encode())
            sent.append(None if value is None else value.decode())
        await serve(self, scope, receive, send)

    monkeypatch.setattr(InterceptionApp, "__call__", spy)
    trace = await vf.run_rollout(
        WriteFile(vf.TaskData(prompt=PROMPT)),
        model=model,
        harness=harness_id,
        harness_options=options,
        runtime="subprocess",
    )
    assert trace.errors == [], trace.errors
    assert trace.rewards["wrote_it"].value == 1.0
    # write, cat, answer (mini-swe-agent: its submit command): one call per turn, on one branch.
    assert len(trace.calls) == 3 and all(c.error is None for c in trace.calls)
    assert len(trace.branch_list) == 1
    assert len(sent) > len(trace.calls), sent  # the agent did re-send
    assert set(sent) <= {"0", None}, sent  # and never marked a retry as one
