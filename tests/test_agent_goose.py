"""goose (the native CLI from npm ``@aaif/goose-binary-linux-x64``) installed into the node's
tool dir and driven by the scripted ``agent`` model through the interception: scored by the file
its ``shell`` tool wrote, in bwrap and in docker (the Debian minbase image), calling a task's
tools over MCP, and stopped by a refused call. Skipped with the reason when npm's registry is
offline."""

from __future__ import annotations

import json
from typing import Any

import pytest
from agent_tools import need_registry

import vfray as vf
from examples.tools_scratchpad import ScratchpadTaskset
from vfray.harnesses import make_harness
from vfray.harnesses.goose import GooseConfig, GooseHarness, binary_package, provider_env
from vfray.harnesses.provisioned import ProvisionedHarness
from vfray.interception import Limits
from vfray.rollout import Timeouts
from vfray.runtimes.base import Runtime
from vfray.runtimes.provision import ensure_tool

PROMPT = 'Write "hello goose" to out.txt, then check it.'


class WriteFile(vf.Task[vf.TaskData]):
    ca_in_box: list[bool] = []

    @vf.reward
    async def wrote_it(self, runtime: Runtime) -> bool:
        found = await runtime.run(["test", "-e", ".vfray/agent/goose-home/ca.pem"])
        WriteFile.ca_in_box.append(found.ok)
        return (await runtime.read("out.txt")) == b"hello goose\n"


@pytest.fixture(scope="module")
def installed() -> None:
    need_registry("npm")
    harness = make_harness("goose")
    assert isinstance(harness, ProvisionedHarness)
    tool = ensure_tool(harness.tool_spec(), harness.tools_root)
    print(f"goose: tool dir {tool.path} ready in {tool.seconds:.1f}s")


async def _rollout(runtime: str, **options: Any) -> vf.Trace:
    data = vf.TaskData(prompt=PROMPT, workdir="/box" if runtime == "bwrap" else None)
    return await vf.run_rollout(
        WriteFile(data), model="scripted:agent", harness="goose", runtime=runtime, **options
    )


def _check_solved(trace: vf.Trace) -> None:
    assert trace.errors == [], trace.errors
    assert trace.stop_condition is vf.StopCondition.COMPLETED
    assert trace.rewards["wrote_it"].value == 1.0
    # write, cat, answer; and goose's session-title request (no tools), answered beside them.
    assert len(trace.calls) == 4 and all(c.error is None for c in trace.calls)
    assert sum(1 for c in trace.calls if not c.tools) == 1
    # goose sends each reply back with its arguments re-serialized ({"command":"ls"}): the
    # agent's calls still extend one branch (the title request is a conversation of its own).
    assert len({c.branch for c in trace.calls if c.tools}) == 1
    assert len(trace.branch_list) == 2
    (artifact,) = trace.artifacts
    events = [json.loads(line) for line in artifact.content.splitlines() if line.startswith("{")]
    assert events[-1]["type"] == "complete"
    shell = [
        part["toolCall"]["value"]
        for e in events
        if e["type"] == "message"
        for part in e["message"]["content"]
        if part.get("type") == "toolRequest"
    ]
    assert [s["name"] for s in shell] == ["shell", "shell"]
    assert shell[1]["arguments"] == {"command": "cat out.txt"}


def test_goose_points_its_openai_provider_at_the_interception() -> None:
    assert provider_env("http://127.0.0.1:9/v1") == {
        "GOOSE_PROVIDER": "openai",
        "OPENAI_HOST": "http://127.0.0.1:9",
        "OPENAI_BASE_PATH": "v1/chat/completions",
    }
    assert provider_env("http://h:9/a/v1/")["OPENAI_BASE_PATH"] == "a/v1/chat/completions"
    assert binary_package("x86_64") == "@aaif/goose-binary-linux-x64"
    assert binary_package("aarch64") == "@aaif/goose-binary-linux-arm64"
    with pytest.raises(vf.ConfigError, match="no binary for CPU 'riscv64'"):
        binary_package("riscv64")
    harness = make_harness("goose", {"extensions": ["developer"], "max_steps": 5})
    assert isinstance(harness, GooseHarness) and isinstance(harness.config, GooseConfig)
    assert harness.SUPPORTS_MCP and not harness.SUPPORTS_RESUME


@pytest.mark.slow
@pytest.mark.bwrap
async def test_a_goose_rollout_scores_in_bwrap(installed: None) -> None:
    _check_solved(await _rollout("bwrap"))
    # Its CA certificate is the node's copy under the tools root, not a file in each box (the
    # docker test's image has none of its own: goose starts only if it reads that copy).
    assert WriteFile.ca_in_box[-1] is False


@pytest.mark.slow
@pytest.mark.docker
async def test_a_goose_rollout_scores_in_docker(
    installed: None, docker_url: str, debian_in_docker: str
) -> None:
    """On the Debian minbase image: the binary needs only glibc, libstdc++ and libgcc_s."""
    options = {"base_url": docker_url, "default_image": debian_in_docker}
    _check_solved(await _rollout("docker", runtime_options=options))


@pytest.mark.slow
async def test_a_refused_call_ends_goose(installed: None) -> None:
    trace = await _rollout("bwrap", limits=Limits(max_turns=1), timeouts=Timeouts(agent=90))
    assert trace.stop_condition is vf.StopCondition.MAX_TURNS, (trace.stop_condition, trace.notes)
    # The one call answered may be the session title, so out.txt may be missing at scoring.
    assert [e for e in trace.errors if e.phase != "scoring"] == []
    assert not [note for note in trace.notes if "agent budget" in note], trace.notes
    after = trace.timing["agent"].end - trace.calls[-1].ended_at
    print(
        f"goose: max_turns=1 agent phase {trace.timing['agent'].duration:.1f}s, {after:.1f}s after"
    )
    assert after < 30, after  # a hang check, not a performance bound


@pytest.mark.slow
@pytest.mark.bwrap
async def test_goose_calls_the_scratchpad_over_mcp(installed: None) -> None:
    """The task's MCP server, a streamable-HTTP extension in goose's config, is offered to the
    model and its tools are called from the box."""
    task = ScratchpadTaskset().load()[3]
    trace = await vf.run_rollout(task, model="scripted:agent", harness="goose", runtime="bwrap")
    assert trace.errors == [], trace.errors
    offered = {t["function"]["name"] for c in trace.calls for t in c.tools or []}
    assert any(name.endswith("write_note") for name in offered), offered
    assert [c.name for c in trace.tool_calls] == ["write_note", "read_note"]
    assert trace.tool_calls[1].result == "water plants"
    assert trace.rewards["remembered"].value == 1.0
