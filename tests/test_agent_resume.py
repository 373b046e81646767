"""The npm agent CLIs that resume: a task that continues through ``next_message`` runs a second
segment in the same box, the agent continuing its own session (its CLI's continue flag) on the
new user message, so the second segment's model calls carry the first segment's conversation.
One two-turn rollout per agent in bwrap, against the scripted ``agent`` model; skipped with the
reason when npm is unavailable.
"""

from __future__ import annotations

import json
import shutil

import pytest
from agent_tools import need_registry
from test_agents import _timed_install

import vfray as vf
from vfray.errors import IncompatibleError
from vfray.harnesses import make_harness
from vfray.harnesses.registry import resumable_harnesses
from vfray.run.environment import LocalEnvironment
from vfray.runtimes.base import Runtime

RESUMING = ("claude-code", "codex", "gemini-cli", "kimi-code", "opencode", "pi", "qwen-code")
"""The npm agents whose CLI continues a session (checked with each one's ``--help``)."""
ONE_SHOT = ("openclaw",)
"""Refused for a task that continues: ``openclaw agent exec`` runs one isolated turn."""
THEN = 'Now write "two" to b.txt.'


class WriteTwo(vf.Task[vf.TaskData]):
    """Asks for a.txt, then (one more user message) for b.txt; solved when both hold their
    line."""

    def __init__(self, data: vf.TaskData) -> None:
        super().__init__(data)
        self.then: str | None = THEN

    def next_message(self, trace: vf.Trace) -> str | None:
        message, self.then = self.then, None
        return message

    @vf.reward
    async def wrote_both(self, runtime: Runtime) -> bool:
        for path, text in (("a.txt", b"one\n"), ("b.txt", b"two\n")):
            try:
                if await runtime.read(path) != text:
                    return False
            except vf.SandboxError:
                return False
        return True


def test_the_resumable_agents_are_named_in_the_refusal() -> None:
    resumable = set(resumable_harnesses())
    assert set(RESUMING) <= resumable and not set(ONE_SHOT) & resumable
    for harness_id in ONE_SHOT:
        assert "cannot resume" in (make_harness(harness_id).__doc__ or "")
        env = LocalEnvironment("scripted:echo", harness=harness_id)
        with pytest.raises(IncompatibleError) as caught:
            env.spec.check_task_type(WriteTwo, 1)
        message = str(caught.value)
        assert f"harness {harness_id!r} cannot resume" in message
        assert all(repr(name) in message for name in RESUMING), message
    LocalEnvironment("scripted:echo", harness=RESUMING[0]).spec.check_task_type(WriteTwo, 1)


@pytest.mark.slow
@pytest.mark.bwrap
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="no bwrap")
@pytest.mark.parametrize("harness_id", RESUMING)
async def test_a_second_user_message_continues_the_agents_session(harness_id: str) -> None:
    need_registry("npm")
    _timed_install(harness_id)
    data = vf.TaskData(prompt='Write "one" to a.txt, then check it.', workdir="/box")
    task = WriteTwo(data)
    trace = await vf.run_rollout(task, model="scripted:agent", harness=harness_id, runtime="bwrap")
    assert trace.errors == [], trace.errors
    assert trace.stop_condition is vf.StopCondition.COMPLETED
    assert task.then is None and trace.rewards["wrote_both"].value == 1.0
    first, second = trace.segments
    assert first.end is not None and first.end <= second.start
    later = [c for c in trace.calls if c.started_at >= second.start]
    assert later and len(later) < len(trace.calls)
    assert all(c.error is None for c in trace.calls)
    # The agent continued its session: the second segment's first request holds the first
    # segment's conversation (a fresh run on the new message alone would not), then THEN
    # (kimi-code puts a reminder of its own after it).
    request = [trace.graph[i].text for i in later[0].request_ids]
    asked = max(i for i, text in enumerate(request) if THEN in text)
    assert any("a.txt" in text for text in request[:asked]), request
    assert asked >= len(request) - 2, request
    # Both segments' event streams are in the one transcript, the second after the first.
    (artifact,) = trace.artifacts
    text = artifact.content
    assert text.index("a.txt") < text.rindex("b.txt")
    assert all(json.loads(line) is not None for line in text.splitlines() if line.strip())
