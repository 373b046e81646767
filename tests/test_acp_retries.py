"""Retry coalescing with the live ACP agents: ``claude-code-acp`` (Claude Code under Zed's
adapter) re-sends a request that timed out on its side with ``x-stainless-retry-count: 0``, and
``codex-acp`` re-sends a stream that went idle (no retry header, ``client_metadata`` keys in a
fresh order), as their one-shot CLIs do; the interception joins or replays each re-send, so the
trace holds one ModelCall per turn and the rollout is scored.

The model takes 4 s per call (codex-acp: its stream stalls 4 s after the first event) and each
agent gives up after 1.5 s, so every turn is sent several times. A pass-through spy on the
interception app counts what the agents sent (it changes nothing). Skipped with the reason when
npm is offline.
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
    ("harness_id", "route", "model", "options"),
    [
        # The adapter runs Claude Code with the session's environment: its API timeout applies.
        (
            "claude-code-acp",
            "/v1/messages",
            "scripted:agent?latency=4",
            {"env": {"API_TIMEOUT_MS": "1500"}},
        ),
        # Codex's idle timeout covers the wait between stream events only, so the stream stalls
        # after its head and first event (as in the codex CLI's test); codex-acp takes Codex's
        # own ``-c`` overrides.
        (
            "codex-acp",
            "/v1/responses",
            "scripted:agent?stall=4",
            {"extra_args": ["-c", "model_providers.vfray.stream_idle_timeout_ms=1500"]},
        ),
    ],
)
async def test_acp_agents_resends_are_one_call_each(
    monkeypatch: pytest.MonkeyPatch,
    harness_id: str,
    route: str,
    model: str,
    options: dict[str, Any],
) -> None:
    need_registry("npm")
    harness = make_harness(harness_id)
    assert isinstance(harness, ProvisionedHarness)
    ensure_tool(harness.tool_spec(), harness.tools_root)
    sent: list[str | None] = []
    serve = InterceptionApp.__call__

    async def spy(self: InterceptionApp, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == route:
            value = dict(scope["headers"]).get(RETRY_HEADER.encode())
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
    assert trace.stop_condition is vf.StopCondition.COMPLETED
    assert trace.rewards["wrote_it"].value == 1.0
    # write, cat, answer: one call per turn, on one branch, however often each was sent.
    assert len(trace.calls) == 3 and all(c.error is None for c in trace.calls)
    assert len(trace.branch_list) == 1
    assert len(sent) > len(trace.calls), sent  # the agent did re-send
    assert set(sent) <= {"0", None}, sent  # and never marked a retry as one
