"""Endpoint-contract conformance: verifiers v1's own bash program (PyPI ``verifiers``, unchanged)
runs a scored rollout through vfray's interception against the scripted ``agent`` model.

The program streams chat completions with ``stream_options.include_usage``, asks ``GET /v1/models``
for a context window (its compaction), and retries transport errors itself; the trace must hold
every call and the task's reward must see the file it wrote. Skipped when PyPI is unreachable.
"""

from __future__ import annotations

import pytest
from agent_tools import need_registry

import vfray as vf
from vfray.harnesses import make_harness
from vfray.runtimes.base import Runtime
from vfray.runtimes.provision import ensure_tool
from vfray.testing.verifiers_bash import VerifiersBashConfig, VerifiersBashHarness

HARNESS = "vfray.testing.verifiers_bash:VerifiersBashHarness"


class WriteFile(vf.Task[vf.TaskData]):
    """Solved when the box's out.txt holds the line the prompt asked for."""

    @vf.reward
    async def wrote_it(self, runtime: Runtime) -> bool:
        return (await runtime.read("out.txt")) == b"hello verifiers\n"


def test_the_harness_is_found_by_import_path_with_a_typed_config() -> None:
    harness = make_harness(HARNESS, {"version": "0.4.0", "compaction": False})
    assert isinstance(harness, VerifiersBashHarness)
    assert isinstance(harness.config, VerifiersBashConfig) and not harness.config.compaction


@pytest.mark.slow
@pytest.mark.parametrize("compaction", [True, False])
async def test_verifiers_bash_program_runs_unchanged_through_the_interception(
    compaction: bool,
) -> None:
    need_registry("pypi")
    harness = VerifiersBashHarness()
    tool = ensure_tool(harness.tool_spec(), harness.tools_root)
    print(f"verifiers {harness.config.version}: tool dir {tool.path} in {tool.seconds:.1f}s")
    data = vf.TaskData(
        prompt='Write "hello verifiers" to out.txt, then check it.',
        system_prompt="Work in the current directory.",
    )
    trace = await vf.run_rollout(
        WriteFile(data),
        model="scripted:agent",
        harness=HARNESS,
        harness_options={"compaction": compaction},
        runtime="subprocess",
    )
    assert trace.errors == [], trace.errors
    assert trace.stop_condition is vf.StopCondition.COMPLETED
    assert trace.rewards["wrote_it"].value == 1.0
    # write, cat, final answer: every call streamed in the chat dialect, with its usage.
    assert len(trace.calls) == 3 and all(c.error is None for c in trace.calls)
    assert all(c.dialect == "chat" and c.streamed for c in trace.calls)
    assert all(c.usage.output_tokens > 0 for c in trace.calls)
    assert {t["function"]["name"] for t in trace.calls[0].tools or []} >= {"bash", "edit"}
    system = trace.messages[0]
    assert system.role == "system" and system.text.startswith("You are a coding agent.")
    assert system.text.endswith("\n\nWork in the current directory.")
    assert trace.last_reply is not None and "hello verifiers" in trace.last_reply
    assert len(trace.branch_list) == 1
