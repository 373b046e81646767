"""What verifiers v1's harnesses have, through real rollouts of the chat loop (the scripted
``agent`` model): ``disabled_tools`` keeps a tool from the model, ``forward_env`` hands named host
variables to the program and never a credential, and a harness's own ``score`` (metrics after
the task's) and ``cleanup`` (at teardown, the box still up) hooks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import pytest

import vfray as vf
from examples.tools_scratchpad import ScratchpadTaskset
from vfray.errors import ConfigError
from vfray.harnesses import make_harness
from vfray.harnesses.bash import BashHarness
from vfray.harnesses.registry import register_harness
from vfray.runtimes.base import Runtime


async def test_a_disabled_tool_is_not_offered_to_the_model() -> None:
    task = ScratchpadTaskset().load()[0]
    trace = await vf.run_rollout(
        task,
        model="scripted:agent",
        harness="bash",
        harness_options={"disabled_tools": ["read_note"]},
    )
    assert trace.errors == [], trace.errors
    offered = {t["function"]["name"] for t in trace.calls[0].tools or []}
    assert {"write_note", "bash", "edit"} <= offered and "read_note" not in offered
    assert [c.name for c in trace.tool_calls] == ["write_note"]
    assert trace.rewards["remembered"].value == 0.0
    # The program's own tool too, and an MCP tool named as server__tool.
    trace = await vf.run_rollout(
        task,
        model="scripted:agent",
        harness="bash",
        harness_options={"disabled_tools": ["bash", "edit", "scratchpad__write_note"]},
    )
    offered = {t["function"]["name"] for t in trace.calls[0].tools or []}
    assert offered == {"read_note"}


def test_disabled_tools_is_refused_by_a_harness_that_cannot_honour_it() -> None:
    with pytest.raises(ConfigError, match="unknown option 'disabled_tools'"):
        make_harness("mini-swe-agent", {"disabled_tools": ["bash"]})
    claude = make_harness("claude-code", {"disabled_tools": ["Bash", "WebFetch"]})
    assert claude.config.disabled_tools == ("Bash", "WebFetch")  # type: ignore[attr-defined]


class EchoesVariable(vf.Task[vf.TaskData]):
    @vf.reward
    async def forwarded(self, runtime: Runtime) -> float:
        return float((await runtime.read("fwd.txt")).decode().strip() == "from the host")


async def test_forward_env_hands_named_host_variables_to_the_program(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("VFRAY_TEST_FORWARDED", "from the host")
    monkeypatch.setenv("VFRAY_TEST_NOT_FORWARDED", "kept here")
    prompt = 'run: echo "$VFRAY_TEST_FORWARDED$VFRAY_TEST_NOT_FORWARDED" > fwd.txt'
    trace = await vf.run_rollout(
        EchoesVariable(vf.TaskData(prompt=prompt)),
        model="scripted:agent",
        harness="bash",
        harness_options={"forward_env": ["VFRAY_TEST_FORWARDED", "VFRAY_TEST_UNSET"]},
    )
    assert trace.errors == [], trace.errors
    assert trace.rewards["forwarded"].value == 1.0


def test_forward_env_never_names_a_credential(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError) as caught:
        make_harness("codex", {"forward_env": ["OPENAI_API_KEY", "GH_TOKEN", "LANGUAGE"]})
    message = str(caught.value)
    assert "\n" not in message and "OPENAI_API_KEY, GH_TOKEN look like credentials" in message
    # The model's own key variable, whatever its name.
    monkeypatch.setenv("MY_LLM", "sk-test")
    with pytest.raises(ConfigError, match="MY_LLM, the model's API key variable"):
        vf.LocalEnvironment(
            "scripted:echo",
            harness="bash",
            api_key_var="MY_LLM",
            harness_options={"forward_env": ["MY_LLM"]},
        )


class Audited(BashHarness):
    """Adds a metric from the box after the agent, and cleans up host state it kept."""

    id = "test_audited"
    cleaned: ClassVar[list[str]] = []
    fail_score = False

    async def score(self, trace: vf.Trace, runtime: Runtime) -> Mapping[str, float | None]:
        if self.fail_score:
            raise RuntimeError("no audit today")
        size = len(await runtime.read("note.txt"))  # the box is still up
        return {"note_bytes": float(size), "solved": 0.5}

    async def cleanup(self, runtime: Runtime) -> None:
        self.cleaned.append((await runtime.read("note.txt")).decode().strip())


class WritesNote(vf.Task[vf.TaskData]):
    @vf.metric
    async def solved(self, runtime: Runtime) -> float:
        return float(await runtime.read("note.txt") == b"hi\n")


async def test_the_harness_scores_after_the_task_and_cleans_up_at_teardown() -> None:
    register_harness(Audited)
    task = WritesNote(vf.TaskData(prompt='Write "hi" to note.txt'))
    trace = await vf.run_rollout(task, model="scripted:agent", harness="test_audited")
    assert trace.errors == [], trace.errors
    # The task's own metric stands; the harness's is added beside it.
    assert trace.metrics == {"solved": 1.0, "note_bytes": 3.0}
    assert Audited.cleaned == ["hi"]  # called before the box stopped
    assert trace.timing["teardown"].start <= trace.timing["teardown"].end  # type: ignore[operator]
    Audited.fail_score = True
    try:
        trace = await vf.run_rollout(task, model="scripted:agent", harness="test_audited")
    finally:
        Audited.fail_score = False
    assert trace.errors == [] and trace.metrics == {"solved": 1.0}
    assert "harness score failed: RuntimeError: no audit today" in trace.notes
    assert Audited.cleaned == ["hi", "hi"]
