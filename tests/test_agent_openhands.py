"""The ``openhands`` harness: OpenHands' SDK agent from PyPI in the node's tool dir, on a Python
3.13 from Debian 13's packages, driven by the scripted ``agent`` model through its ``terminal`` tool
via the interception, in a bwrap box and in a docker container, and calling a task's tools over
MCP; a refused call ends it. Skipped
with the reason when PyPI or the box is not there (the interpreter needs Debian's archive too)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from agent_tools import check_ended_after_refusal, need_registry
from docker_engine import runtime_options
from test_agents import PROMPT, WriteFile, _check_solved

import vfray as vf
from examples.tools_scratchpad import ScratchpadTaskset
from vfray.harnesses import make_harness
from vfray.harnesses._debian_python import ensure_python
from vfray.harnesses.openhands import OpenHandsConfig, OpenHandsHarness
from vfray.interception import Limits
from vfray.rollout import Timeouts
from vfray.runtimes.provision import ensure_tool

HARNESS = "openhands"


def test_the_harness_is_built_in_with_a_typed_config() -> None:
    harness = make_harness(HARNESS, {"tools": ["terminal"], "max_steps": 7})
    assert isinstance(harness, OpenHandsHarness) and isinstance(harness.config, OpenHandsConfig)
    argv = harness.argv("/tools/venv/bin/python")
    # Started by the box's shell: the interpreter brings its own loader.
    assert argv[:3] == ["/bin/sh", "-c", 'exec "$@"'] and argv[4] == "/tools/venv/bin/python"
    assert argv[argv.index("--tools") + 1] == "terminal"
    assert argv[argv.index("--max-iterations") + 1] == "7"
    assert "--mcp" not in argv
    servers = {"scratchpad": "http://127.0.0.1:9/mcp"}
    with_mcp = harness.argv("/tools/venv/bin/python", servers)
    assert json.loads(with_mcp[with_mcp.index("--mcp") + 1]) == servers
    assert harness.SUPPORTS_MCP
    spec = harness.tool_spec()
    assert spec.python is not None and "python3.13-debian-trixie" in spec.python
    with pytest.raises(vf.ConfigError, match=r"tools\.0: Input should be 'terminal'"):
        make_harness(HARNESS, {"tools": ["browser"]})
    with pytest.raises(vf.ConfigError, match="does not mount; use bwrap, docker or subprocess"):
        harness.preflight("modal")  # its image would not carry the tool dir's interpreter


def _install() -> None:
    need_registry("pypi")
    harness = make_harness(HARNESS)
    assert isinstance(harness, OpenHandsHarness)
    python = ensure_python(Path(harness.tools_root))
    tool = ensure_tool(harness.tool_spec(), harness.tools_root)
    print(f"{HARNESS}: {python} and {tool.path} ready in {tool.seconds:.1f}s")


class Anything(vf.Task[vf.TaskData]):
    """Any outcome scores: the stop test's task."""

    @vf.reward
    async def ran(self) -> bool:
        return True


async def _rollout(
    runtime: str,
    task: type[vf.Task[vf.TaskData]] = WriteFile,
    prompt: str = PROMPT,
    **options: object,
) -> vf.Trace:
    _install()
    data = vf.TaskData(prompt=prompt, workdir="/box" if runtime == "bwrap" else None)
    return await vf.run_rollout(
        task(data), model="scripted:agent", harness=HARNESS, runtime=runtime, **options
    )


def _check_openhands_solved(trace: vf.Trace) -> None:
    # Two terminal calls (write, check), then a final answer with no tool call ends the run.
    _check_solved(trace, calls=3)
    assert "terminal" in {t["function"]["name"] for t in trace.calls[0].tools or []}
    events = next(a for a in trace.artifacts if a.name == "openhands-events.jsonl")
    kinds = [json.loads(line)["kind"] for line in events.content.splitlines()]
    assert "ActionEvent" in kinds and "ObservationEvent" in kinds, kinds


@pytest.mark.slow
@pytest.mark.bwrap
async def test_openhands_rollout_in_bwrap() -> None:
    """The tool dir is bound read-only; the box has no network but the interception's bridge,
    so a start that reached out (litellm's cost map, telemetry) would fail or stall."""
    _check_openhands_solved(await _rollout("bwrap"))


@pytest.mark.slow
@pytest.mark.docker
async def test_openhands_rollout_in_docker(docker_url: str) -> None:
    _check_openhands_solved(await _rollout("docker", runtime_options=runtime_options(docker_url)))


@pytest.mark.slow
@pytest.mark.bwrap
async def test_a_refused_call_ends_openhands() -> None:
    """The interception refuses the second call (max_turns=1); the SDK retries a failed call
    (2 retries here) and is ended within the stop grace."""
    trace = await _rollout(
        "bwrap",
        Anything,
        "run: echo one\nrun: echo two",
        limits=Limits(max_turns=1),
        timeouts=Timeouts(agent=120),
    )
    check_ended_after_refusal(trace, HARNESS)


@pytest.mark.slow
@pytest.mark.bwrap
async def test_openhands_calls_the_scratchpad_over_mcp() -> None:
    """The task's MCP server, given to the SDK as its ``mcp_config``, is offered to the model
    beside the agent's own tools, and its tools are called from the box."""
    _install()
    task = ScratchpadTaskset().load()[3]
    trace = await vf.run_rollout(task, model="scripted:agent", harness=HARNESS, runtime="bwrap")
    assert trace.errors == [], trace.errors
    offered = {t["function"]["name"] for t in trace.calls[0].tools or []}
    assert {"terminal", "write_note", "read_note"} <= offered, offered
    assert [c.name for c in trace.tool_calls] == ["write_note", "read_note"]
    assert trace.tool_calls[1].result == "water plants"
    assert trace.rewards["remembered"].value == 1.0
