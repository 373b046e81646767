"""The live ACP agents (``claude-code-acp``, ``codex-acp``) in ``docker``: the agent runs in a
network-less container (the tool dir mounted read-only), its stdio streamed over the engine's
attach socket, and reaches the interception through the bridge. Two rollouts per agent, sharing
the session's engine: two segments on the same live process (the second user message resumes
the session, with its context), and a call refused past a limit, after which the rollout stops
cleanly and no agent process is left in the container. Skipped with the reason when npm or the
engine is unavailable.
"""

from __future__ import annotations

from typing import Any

import pytest
from docker_engine import runtime_options
from test_acp import ACP_HARNESSES, WriteFiles, _commands, _install, _transcript

import vfray as vf
from vfray.interception import Limits
from vfray.rollout import Timeouts
from vfray.runtimes.base import Runtime

pytestmark = [pytest.mark.slow, pytest.mark.docker]

AGENT_PROGRAMS = {"claude-code-acp": "claude", "codex-acp": "codex-acp"}
"""A word of each agent's command lines (Claude Code's adapter runs ``claude`` under node)."""


class WriteFilesInDocker(WriteFiles):
    """Also counts, after the agent phase, the agent's processes left in the container (-1: the
    listing did not show the container's main process, so it proves nothing)."""

    program = ""

    @vf.metric
    async def agent_processes(self, runtime: Runtime) -> float:
        # Every process's command line, read from the container's own /proc.
        listing = await runtime.run(
            ["/bin/sh", "-c", 'for p in /proc/[0-9]*; do tr "\\0" " " < "$p/cmdline"; echo; done']
        )
        lines = [line for line in listing.stdout.splitlines() if "/proc/[0-9]" not in line]
        if not listing.ok or not any(line.startswith("sleep infinity") for line in lines):
            return -1.0  # the listing cannot see the container's own processes
        return float(sum(self.program in line for line in lines))


async def _rollout(docker_url: str, task: WriteFilesInDocker, harness_id: str, **kw: Any) -> Any:
    task.program = AGENT_PROGRAMS[harness_id]
    return await vf.run_rollout(
        task,
        model="scripted:agent",
        harness=harness_id,
        runtime="docker",
        runtime_options=runtime_options(docker_url),
        **kw,
    )


@pytest.mark.parametrize("harness_id", ACP_HARNESSES)
async def test_two_segments_on_one_acp_process_in_docker(docker_url: str, harness_id: str) -> None:
    _install(harness_id)
    data = vf.TaskData(prompt='Write "one" to a.txt, then check it.')
    task = WriteFilesInDocker(
        data, {"a.txt": "one", "b.txt": "two"}, then='Now write "two" to b.txt.'
    )
    trace = await _rollout(docker_url, task, harness_id)
    assert trace.errors == [], trace.errors
    assert trace.stop_condition is vf.StopCondition.COMPLETED
    assert trace.rewards["wrote_them"].value == 1.0
    assert all(c.error is None for c in trace.calls)
    assert _commands(trace) == [
        "printf '%s\\n' one > a.txt",
        "cat a.txt",
        "printf '%s\\n' two > b.txt",
        "cat b.txt",
    ]
    first, second = trace.segments
    assert first.end is not None and first.end <= second.start
    later = [c for c in trace.calls if c.started_at >= second.start]
    assert later and len(later) < len(trace.calls)
    # One process and ACP session in the container's work dir (no host pid), two prompts.
    events = _transcript(trace)
    kinds = [e["kind"] for e in events]
    assert kinds.count("process") == kinds.count("new_session") == 1
    (session,) = [e for e in events if e["kind"] == "new_session"]
    (process,) = [e for e in events if e["kind"] == "process"]
    assert session["cwd"] == "/work" and process["pid"] is None
    assert [e["text"] for e in events if e["kind"] == "prompt"][1] == 'Now write "two" to b.txt.'
    assert kinds.count("prompt_response") == 2
    if harness_id == "claude-code-acp":
        # Each command ran in a terminal the client opened in the container.
        assert kinds.count("terminal") == kinds.count("terminal_exit") == 4
    # The second segment's requests carry the first segment's conversation.
    request = [trace.graph[i].text for i in later[0].request_ids]
    assert any("one" in text and "a.txt" in text for text in request)
    # The session closed: the agent was stopped inside the container.
    assert [e for e in events if e["kind"] == "process_exit"]
    assert trace.metrics["agent_processes"] == 0.0


@pytest.mark.parametrize("harness_id", ACP_HARNESSES)
async def test_a_refused_call_ends_the_acp_agent_in_docker(
    docker_url: str, harness_id: str
) -> None:
    _install(harness_id)
    data = vf.TaskData(prompt='Write "one" to a.txt, then check it.')
    task = WriteFilesInDocker(data, {"a.txt": "one"}, then="this is never asked")
    trace = await _rollout(
        docker_url, task, harness_id, limits=Limits(max_turns=2), timeouts=Timeouts(stop_grace=2.0)
    )
    assert trace.stop_condition is vf.StopCondition.MAX_TURNS, trace.errors
    assert trace.errors == []
    assert task.then == "this is never asked"  # no second segment after a stop
    assert len(trace.calls) == 2  # the refused third call is not a ModelCall
    events = _transcript(trace)
    assert [e for e in events if e["kind"] == "process_exit"]
    # Scored after the agent phase, in the still-running container: no agent process is left.
    assert trace.metrics["agent_processes"] == 0.0
