"""Live-session agents over the Agent Client Protocol: the client side answered in a real box
(permissions, files, terminals), and ``claude-code-acp`` / ``codex-acp`` installed from npm into
the node's tool dir, each running whole rollouts in ``bwrap`` against the scripted ``agent``
model: one scored rollout, a two-segment one where the second user message goes to the same
live process, which resumes with its context, and a refused call that ends the agent (the same
in ``docker``: tests/test_acp_docker.py). Skipped with the reason when npm is offline.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from acp.schema import EnvVariable, PermissionOption, ToolCallUpdate
from agent_tools import need_registry

import vfray as vf
from vfray.harnesses import make_harness
from vfray.harnesses.acp._client import BoxClient, Transcript
from vfray.harnesses.acp.base import AcpHarness
from vfray.harnesses.acp.claude_code import ClaudeCodeAcpConfig
from vfray.harnesses.acp.codex import CodexAcpConfig
from vfray.harnesses.provisioned import ProvisionedHarness
from vfray.harnesses.registry import register_harness
from vfray.interception import Limits
from vfray.rollout import Timeouts
from vfray.runtimes.base import Runtime
from vfray.runtimes.provision import InstalledTool, ToolSpec, ensure_tool
from vfray.runtimes.subprocess import SubprocessRuntime

ACP_HARNESSES = ["claude-code-acp", "codex-acp"]
bwrap_only = pytest.mark.skipif(shutil.which("bwrap") is None, reason="no bwrap")


# -- the client side, in a real box ------------------------------------------------------------


@pytest.fixture
async def box() -> AsyncIterator[SubprocessRuntime]:
    runtime = SubprocessRuntime()
    await runtime.start()
    try:
        yield runtime
    finally:
        await runtime.stop()


def _option(option_id: str, kind: str) -> PermissionOption:
    return PermissionOption(option_id=option_id, name=option_id, kind=kind)  # type: ignore[arg-type]


async def test_permission_requests_are_granted_preferring_always(box: Runtime) -> None:
    client = BoxClient(box, Transcript())
    call = ToolCallUpdate(tool_call_id="t1", title="run a command")
    options = [_option("no", "reject_once"), _option("once", "allow_once")]
    options.append(_option("always", "allow_always"))
    answer = await client.request_permission("s", call, options)
    assert answer.outcome.outcome == "selected" and answer.outcome.option_id == "always"
    answer = await client.request_permission("s", call, options[:2])
    assert answer.outcome.option_id == "once"  # type: ignore[union-attr]
    answer = await client.request_permission("s", call, options[:1])
    assert answer.outcome.outcome == "cancelled"
    kinds = [json.loads(line)["kind"] for line in client.transcript.lines]
    assert kinds == ["permission"] * 3


async def test_files_are_read_and_written_in_the_box(box: Runtime) -> None:
    client = BoxClient(box, Transcript())
    workdir = (await box.run(["pwd"])).stdout.strip()
    await client.write_text_file("s", f"{workdir}/dir/notes.txt", "one\ntwo\nthree\n")
    assert await box.read("dir/notes.txt") == b"one\ntwo\nthree\n"
    whole = await client.read_text_file("s", f"{workdir}/dir/notes.txt")
    assert whole.content == "one\ntwo\nthree\n"
    part = await client.read_text_file("s", f"{workdir}/dir/notes.txt", line=2, limit=1)
    assert part.content == "two\n"
    from acp import RequestError

    with pytest.raises(RequestError):
        await client.read_text_file("s", f"{workdir}/missing.txt")


async def test_terminals_run_in_the_box_and_report_their_exit(box: Runtime) -> None:
    client = BoxClient(box, Transcript())
    created = await client.create_terminal(
        "s",
        "echo $GREETING; echo oops >&2; exit 3",
        env=[EnvVariable(name="GREETING", value="hi")],
    )
    done = await client.wait_for_terminal_exit("s", created.terminal_id)
    assert (done.exit_code, done.signal) == (3, None)
    output = await client.terminal_output("s", created.terminal_id)
    assert sorted(output.output.split()) == ["hi", "oops"] and not output.truncated
    assert output.exit_status is not None and output.exit_status.exit_code == 3
    # argv form, a small output limit (the tail is kept), and a kill.
    big = await client.create_terminal(
        "s", "python3", args=["-c", "print('x' * 5000)"], output_byte_limit=100
    )
    await client.wait_for_terminal_exit("s", big.terminal_id)
    tail = await client.terminal_output("s", big.terminal_id)
    assert tail.truncated and len(tail.output) <= 100
    sleeper = await client.create_terminal("s", "sleep 60")
    await client.kill_terminal("s", sleeper.terminal_id)
    status = await client.terminal_output("s", sleeper.terminal_id)
    assert status.exit_status is not None and status.exit_status.exit_code is None
    await client.release_terminal("s", sleeper.terminal_id)
    from acp import RequestError

    with pytest.raises(RequestError):
        await client.terminal_output("s", sleeper.terminal_id)
    await client.close()


def test_acp_harnesses_are_registered_with_typed_configs() -> None:
    claude = make_harness("claude-code-acp", {"env": {"DEBUG": "0"}})
    codex = make_harness("codex-acp", {"reasoning_effort": "low"})
    assert isinstance(claude.config, ClaudeCodeAcpConfig)
    assert isinstance(codex.config, CodexAcpConfig) and codex.config.reasoning_effort == "low"
    for harness in (claude, codex):
        assert isinstance(harness, AcpHarness)
        assert harness.SUPPORTS_RESUME and harness.EXECUTES_CODE and not harness.NEEDS_CONTAINER


class CrashingAgent(AcpHarness):
    """An "agent" that dies before it speaks ACP (a missing key, a wrong binary)."""

    id = "test_crashing_acp"

    def tool_spec(self) -> ToolSpec:
        return ToolSpec(name="none", kind="npm", package="none", version="0")

    async def installed(self) -> InstalledTool:
        here = Path(sys.executable).parent
        return InstalledTool(
            spec=self.tool_spec(), path=here, bin_dir=here, installed_now=False, seconds=0.0
        )

    def agent_argv(self, tool: InstalledTool) -> list[str]:
        script = "import sys; print('not json'); sys.stderr.write('no API key found'); sys.exit(2)"
        return [sys.executable, "-c", script]

    async def agent_env(self, ctx: Any, runtime: Runtime, tool: InstalledTool) -> dict[str, str]:
        return {}


async def test_an_agent_that_dies_is_a_harness_error_with_its_stderr() -> None:
    register_harness(CrashingAgent)
    task = WriteFiles(vf.TaskData(prompt="anything"), {}, then="never asked")
    trace = await vf.run_rollout(
        task,
        model="scripted:agent",
        harness="test_crashing_acp",
        harness_options={"version": "0"},
    )
    assert trace.stop_condition is vf.StopCondition.ERROR
    (error,) = trace.errors
    assert error.type == "HarnessError" and "failed (exit code 2)" in error.message
    assert "the ACP agent exited (2) mid-request" in error.message
    assert "no API key found" in error.message
    assert task.then == "never asked" and trace.calls == []
    kinds = [e["kind"] for e in _transcript(trace)]
    assert kinds[0] == "process" and "agent_stderr" in kinds


async def test_an_image_turn_is_refused_by_the_live_text_session_in_one_line() -> None:
    # The ACP session sends text prompts to one live process: a user turn with an image is
    # refused before the agent starts, naming the harness.
    register_harness(CrashingAgent)

    class Shows(vf.Task[vf.TaskData]):
        def next_message(self, trace: vf.Trace) -> list[dict[str, Any]]:
            return [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]

    trace = await vf.run_rollout(
        Shows(vf.TaskData()),
        model="scripted:agent",
        harness="test_crashing_acp",
        harness_options={"version": "0"},
    )
    (error,) = trace.errors
    assert error.type == "HarnessError" and "\n" not in error.message
    assert error.message.startswith("harness 'test_crashing_acp' keeps one live text-only agent")
    assert "image_url parts" in error.message and trace.calls == []


# -- the real agents -----------------------------------------------------------------------------


class WriteFiles(vf.Task[vf.TaskData]):
    """Solved when the box holds each file the conversation asked for; says ``then`` (one more
    user message) after the first segment when given."""

    def __init__(self, data: vf.TaskData, files: dict[str, str], then: str | None = None):
        super().__init__(data)
        self.files = files
        self.then = then

    def next_message(self, trace: vf.Trace) -> str | None:
        message, self.then = self.then, None
        return message

    @vf.reward
    async def wrote_them(self, runtime: Runtime) -> bool:
        for path, text in self.files.items():
            if await runtime.read(path) != f"{text}\n".encode():
                return False
        return True


def _install(harness_id: str) -> None:
    need_registry("npm")
    harness = make_harness(harness_id)
    assert isinstance(harness, ProvisionedHarness)
    tool = ensure_tool(harness.tool_spec(), harness.tools_root)
    print(f"{harness_id}: tool dir {tool.path} ready in {tool.seconds:.1f}s")


async def _rollout(task: vf.Task[Any], harness_id: str, **options: Any) -> vf.Trace:
    # Not bwrap's default /work: a host venv under /work (this machine's) would be hidden.
    return await vf.run_rollout(
        task, model="scripted:agent", harness=harness_id, runtime="bwrap", **options
    )


def _transcript(trace: vf.Trace) -> list[dict[str, Any]]:
    (artifact,) = trace.artifacts
    assert artifact.name == "acp-transcript.jsonl" and not artifact.truncated
    return [json.loads(line) for line in artifact.content.splitlines()]


def _commands(trace: vf.Trace) -> list[str]:
    """The shell commands the model asked for, in call order."""
    commands = []
    for call in trace.calls:
        reply = trace.graph[call.response_id] if call.response_id else None
        for tool_call in (reply.tool_calls or []) if reply else []:
            arguments = json.loads(tool_call["function"]["arguments"])
            commands.append(arguments.get("command") or arguments.get("cmd"))
    return commands


@pytest.mark.slow
@pytest.mark.bwrap
@bwrap_only
@pytest.mark.parametrize("harness_id", ACP_HARNESSES)
async def test_acp_agent_rollout_in_bwrap(harness_id: str) -> None:
    _install(harness_id)
    data = vf.TaskData(prompt='Write "hello agent" to out.txt, then check it.', workdir="/box")
    trace = await _rollout(WriteFiles(data, {"out.txt": "hello agent"}), harness_id)
    assert trace.errors == [], trace.errors
    assert trace.stop_condition is vf.StopCondition.COMPLETED
    assert trace.rewards["wrote_them"].value == 1.0
    assert all(c.error is None for c in trace.calls)
    assert _commands(trace) == ["printf '%s\\n' 'hello agent' > out.txt", "cat out.txt"]
    assert trace.last_reply is not None and "hello agent" in trace.last_reply
    events = _transcript(trace)
    kinds = [e["kind"] for e in events]
    assert kinds.count("initialize") == kinds.count("prompt") == 1
    assert events[kinds.index("prompt_response")]["response"] == {"stopReason": "end_turn"}
    # The agent's stream, each update as it sent it, all before the turn's response.
    updates = [e["update"] for e in events if e["kind"] == "update"]
    assert kinds.index("prompt_response") > max(i for i, k in enumerate(kinds) if k == "update")
    chunks = [u for u in updates if u["sessionUpdate"] == "agent_message_chunk"]
    assert "hello agent" in "".join(u["content"]["text"] for u in chunks)
    if harness_id == "claude-code-acp":
        # Claude Code asks before its first command (granted, for good) and runs both commands
        # in terminals the client opens in the box; Codex runs them itself, unasked.
        asked = [e for e in events if e["kind"] == "permission"]
        assert asked and all(e["granted"] for e in asked)
        assert kinds.count("terminal") == kinds.count("terminal_exit") == 2


@pytest.mark.slow
@pytest.mark.bwrap
@bwrap_only
@pytest.mark.parametrize("harness_id", ACP_HARNESSES)
async def test_a_second_user_message_resumes_the_same_acp_process(harness_id: str) -> None:
    _install(harness_id)
    data = vf.TaskData(prompt='Write "one" to a.txt, then check it.', workdir="/box")
    task = WriteFiles(data, {"a.txt": "one", "b.txt": "two"}, then='Now write "two" to b.txt.')
    trace = await _rollout(task, harness_id)
    assert trace.errors == [], trace.errors
    assert trace.stop_condition is vf.StopCondition.COMPLETED
    assert trace.rewards["wrote_them"].value == 1.0
    assert _commands(trace) == [
        "printf '%s\\n' one > a.txt",
        "cat a.txt",
        "printf '%s\\n' two > b.txt",
        "cat b.txt",
    ]
    # Both segments' turns are on the trace, each inside its own span.
    first, second = trace.segments
    assert first.end is not None and first.end <= second.start
    later = [c for c in trace.calls if c.started_at >= second.start]
    assert later and len(later) < len(trace.calls)
    # One process, one ACP session, two prompts: the second segment resumed it.
    events = _transcript(trace)
    kinds = [e["kind"] for e in events]
    assert kinds.count("process") == kinds.count("new_session") == 1
    assert [e["text"] for e in events if e["kind"] == "prompt"][1] == 'Now write "two" to b.txt.'
    assert kinds.count("prompt_response") == 2
    # With its context: the second segment's requests carry the first segment's conversation.
    request = [trace.graph[i].text for i in later[0].request_ids]
    assert any("one" in text and "a.txt" in text for text in request)
    assert request[-1] == 'Now write "two" to b.txt.' or any(
        'Now write "two" to b.txt.' in text for text in request[-2:]
    )
    (pid,) = [e["pid"] for e in events if e["kind"] == "process"]
    assert not os.path.exists(f"/proc/{pid}") or _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.slow
@pytest.mark.bwrap
@bwrap_only
@pytest.mark.parametrize("harness_id", ACP_HARNESSES)
async def test_a_refused_call_ends_the_acp_agent(harness_id: str) -> None:
    _install(harness_id)
    data = vf.TaskData(prompt='Write "one" to a.txt, then check it.', workdir="/box")
    task = WriteFiles(data, {"a.txt": "one"}, then="this is never asked")
    trace = await _rollout(
        task, harness_id, limits=Limits(max_turns=2), timeouts=Timeouts(stop_grace=2.0)
    )
    assert trace.stop_condition is vf.StopCondition.MAX_TURNS, trace.errors
    assert trace.errors == []
    assert task.then == "this is never asked"  # no second segment after a stop
    events = _transcript(trace)
    (pid,) = [e["pid"] for e in events if e["kind"] == "process"]
    assert [e for e in events if e["kind"] == "process_exit"]
    assert not os.path.exists(f"/proc/{pid}") or _is_zombie(pid)
