"""Harness segments in real rollouts: a task's ``next_message`` resumes the agent (the chat loop
relaunched on its transcript), each segment's calls land on the same trace, and waiting for the
user is never charged to the agent's budget. Scripted model, subprocess runtime."""

from __future__ import annotations

import asyncio
from typing import Any

import vfray as vf
from vfray.harnesses import NullHarness
from vfray.harnesses.chat import TRANSCRIPT_PATH
from vfray.harnesses.registry import register_harness
from vfray.interception import Limits
from vfray.rollout import Timeouts, run_planned_rollout
from vfray.run.broker import InProcessBroker
from vfray.run.environment import LocalEnvironment
from vfray.runtimes.base import Runtime
from vfray.trace import AgentArtifact


class Conversation(vf.Task[vf.TaskData]):
    """Says each of ``replies`` in turn once a segment ends (after ``wait`` seconds), and notes
    how many calls the trace held when asked."""

    def __init__(self, data: vf.TaskData, replies: list[str], wait: float = 0.0) -> None:
        super().__init__(data)
        self.replies = list(replies)
        self.wait = wait
        self.seen_calls: list[int] = []

    async def next_message(self, trace: vf.Trace) -> str | None:
        self.seen_calls.append(len(trace.calls))
        await asyncio.sleep(self.wait)
        return self.replies.pop(0) if self.replies else None


class TwoFiles(Conversation):
    @vf.reward
    async def both_written(self, runtime: Runtime) -> bool:
        a, b = await runtime.read("a.txt"), await runtime.read("b.txt")
        return (a, b) == (b"one\n", b"two\n")


def texts(trace: vf.Trace, call: int) -> list[tuple[str, str]]:
    request = [trace.graph[i] for i in trace.calls[call].request_ids]
    return [(m.role, m.text) for m in request]


async def test_a_second_user_message_resumes_the_bash_agent_on_the_same_trace() -> None:
    task = TwoFiles(
        vf.TaskData(prompt='Write "one" to a.txt, then check it.'),
        ['Now write "two" to b.txt.'],
        wait=0.3,
    )
    trace = await vf.run_rollout(task, model="scripted:agent", harness="bash")
    assert trace.errors == [], trace.errors
    assert trace.stop_condition is vf.StopCondition.COMPLETED
    assert trace.rewards["both_written"].value == 1.0
    # write, cat, answer in each segment; the user was asked after each, seeing the calls.
    assert len(trace.calls) == 6 and task.seen_calls == [3, 6]
    first, second = trace.segments
    assert first.end is not None and second.start - first.end >= 0.3
    assert all(first.start <= c.started_at <= first.end for c in trace.calls[:3])
    assert all(c.started_at >= second.start for c in trace.calls[3:])
    # The relaunch carried the whole first segment: one branch, one growing context.
    assert len(trace.branch_list) == 1
    assert texts(trace, 3)[-1] == ("user", 'Now write "two" to b.txt.')
    assert texts(trace, 3)[: len(texts(trace, 2)) + 1] == [
        *texts(trace, 2),
        ("assistant", trace.graph[trace.calls[2].response_id or ""].text),
    ]


async def test_the_resumed_conversation_keeps_the_system_prompt_and_order() -> None:
    task = Conversation(vf.TaskData(prompt="first", system_prompt="S"), ["and now this"])
    trace = await vf.run_rollout(task, model="scripted:echo", harness="null")
    assert trace.stop_condition is vf.StopCondition.COMPLETED and trace.errors == []
    assert texts(trace, 1) == [
        ("system", "S"),
        ("user", "first"),
        ("assistant", "first"),
        ("user", "and now this"),
    ]
    assert trace.last_reply == "and now this"


async def test_the_user_speaks_first_when_the_task_has_no_prompt() -> None:
    task = Conversation(vf.TaskData(prompt=None), ["opening", "follow-up"])
    trace = await vf.run_rollout(task, model="scripted:echo", harness="null")
    assert trace.errors == []
    assert texts(trace, 0) == [("user", "opening")]
    assert texts(trace, 1) == [("user", "opening"), ("assistant", "opening"), ("user", "follow-up")]
    assert task.seen_calls == [0, 1, 2]


async def test_no_resume_after_a_failed_segment() -> None:
    task = Conversation(vf.TaskData(prompt="x"), ["more"])
    trace = await vf.run_rollout(
        task, model="scripted:echo", harness="null", harness_options={"python": "false"}
    )
    assert trace.stop_condition is vf.StopCondition.ERROR
    assert trace.errors[0].type == "HarnessError"
    assert task.seen_calls == [] and len(trace.segments) == 1


async def test_no_resume_after_the_interception_stopped_the_rollout() -> None:
    task = Conversation(vf.TaskData(prompt='Write "one" to a.txt.'), ["more"])
    trace = await vf.run_rollout(
        task, model="scripted:agent", harness="bash", limits=Limits(max_turns=1)
    )
    assert trace.stop_condition is vf.StopCondition.MAX_TURNS and trace.errors == []
    assert task.seen_calls == [] and len(trace.calls) == 1


async def test_waiting_for_the_user_is_not_agent_time() -> None:
    # Two waits of 6 s each, an agent budget of 10 s: only the three short segments count.
    task = Conversation(vf.TaskData(prompt="a"), ["b", "c"], wait=6.0)
    trace = await vf.run_rollout(
        task, model="scripted:echo", harness="null", timeouts=Timeouts(agent=10.0)
    )
    assert trace.errors == [], trace.errors
    assert trace.stop_condition is vf.StopCondition.COMPLETED
    assert len(trace.segments) == 3
    assert trace.last_reply == "c"


@register_harness
class OneShotHarness(NullHarness):
    id = "test_one_shot"
    SUPPORTS_RESUME = False


async def test_a_harness_that_cannot_resume_is_a_harness_error() -> None:
    task = Conversation(vf.TaskData(prompt="a"), ["b"])
    trace = await vf.run_rollout(task, model="scripted:echo", harness="test_one_shot")
    assert trace.stop_condition is vf.StopCondition.ERROR
    assert trace.errors[0].type == "HarnessError"
    assert "cannot resume" in trace.errors[0].message
    assert len(trace.calls) == 1  # the first segment's call is kept


async def test_a_failing_next_message_is_a_task_error() -> None:
    class Broken(vf.Task[vf.TaskData]):
        def next_message(self, trace: vf.Trace) -> str | None:
            raise RuntimeError("the user simulator fell over")

    task = Broken(vf.TaskData(prompt="a"))
    trace = await vf.run_rollout(task, model="scripted:echo", harness="null")
    assert trace.stop_condition is vf.StopCondition.ERROR
    assert trace.errors[0].type == "TaskError" and "fell over" in trace.errors[0].message
    assert len(trace.calls) == 1


async def test_a_user_turn_of_content_parts_reaches_the_model_with_its_image() -> None:
    # A user turn may be content parts (images too), as a prompt may: the chat loop resumes on
    # them and the `images` model names the image; anything else is one TaskError line.
    image = "data:image/png;base64,aW1hZ2U="

    class Shows(vf.Task[vf.TaskData]):
        def next_message(self, trace: vf.Trace) -> Any:
            if len(trace.calls) == 1:
                return [{"type": "image_url", "image_url": {"url": image}}]
            return 42 if len(trace.calls) == 2 else None

    trace = await vf.run_rollout(Shows(vf.TaskData(prompt="a")), model="scripted:images")
    assert [m.content for m in trace.messages if m.role == "user"][1] == [
        {"type": "image_url", "image_url": {"url": image}}
    ]
    assert trace.last_reply == "image 1: image/png, 5 bytes, sha256 6105d6cc76af"
    assert trace.errors[0].type == "TaskError" and trace.errors[0].message.startswith(
        "next_message must return a str, a list of content parts (dicts with a 'type') or None"
    )


class CopyingBroker(InProcessBroker):
    """Records into a copy of the trace, as a broker across a process boundary (the node's
    interception deployment) does: the rollout's own trace never sees the calls."""

    async def register(self, trace: vf.Trace, *args: Any) -> str:
        return await super().register(vf.Trace.model_validate_json(trace.model_dump_json()), *args)


async def test_segments_survive_a_broker_across_a_process_boundary() -> None:
    task = Conversation(vf.TaskData(prompt="first"), ["second"])
    async with LocalEnvironment("scripted:echo", harness="null") as env:
        trace = await run_planned_rollout(
            task,
            plan=env.plan,
            harness=env.harness,
            runtime_options={},
            broker=CopyingBroker(env.interception.app),
            interception_url=env.interception.url,
        )
    assert trace.errors == [] and trace.stop_condition is vf.StopCondition.COMPLETED
    # The broker's copy holds the calls; the rollout's segments and phases are merged into it.
    assert len(trace.calls) == 2 and len(trace.segments) == 2
    assert "agent" in trace.timing and trace.last_reply == "second"


async def test_a_user_past_its_deadline_is_a_task_error() -> None:
    task = Conversation(vf.TaskData(prompt="a"), ["b"], wait=30.0)
    trace = await vf.run_rollout(
        task, model="scripted:echo", harness="null", timeouts=Timeouts(user=0.5)
    )
    assert trace.stop_condition is vf.StopCondition.ERROR
    assert trace.errors[0].type == "TaskError"
    assert "did not answer within 0.5s" in trace.errors[0].message
    assert len(trace.calls) == 1 and len(trace.segments) == 1


@register_harness
class KeepingHarness(NullHarness):
    """The null harness, keeping its chat loop's transcript as an artifact."""

    id = "test_keeping"

    async def collect_artifacts(self, runtime: Runtime) -> list[AgentArtifact]:
        text = (await runtime.read(TRANSCRIPT_PATH)).decode()
        return [AgentArtifact(name="transcript.json", content=text)]


async def test_the_agents_transcript_is_kept_when_the_exchange_fails() -> None:
    class Broken(vf.Task[vf.TaskData]):
        def next_message(self, trace: vf.Trace) -> str | None:
            raise RuntimeError("the user simulator fell over")

    task = Broken(vf.TaskData(prompt="keep me"))
    trace = await vf.run_rollout(task, model="scripted:echo", harness="test_keeping")
    assert trace.errors[0].type == "TaskError"
    (artifact,) = trace.artifacts
    assert "keep me" in artifact.content
