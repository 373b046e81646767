"""Tools over MCP (vfray.tools): toolsets served per rollout or shared, on the host or in the
box, driven by the built-in bash harness and the scripted ``agent`` model's ``tool:`` steps;
calls recorded on the trace; a tool that raises, hangs or returns 10 MB; a server that cannot
start; a harness without MCP refused."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

import vfray as vf
from examples.tools_glossary import GlossaryTaskset
from examples.tools_scratchpad import ScratchpadTaskset
from tests.fixtures.tool_sets import Faulty, InBoxFaulty, Redacting, ToolTask, Unpicklable
from vfray.errors import IncompatibleError
from vfray.tools import McpServer
from vfray.tools.host import host_server

ROOT = str(Path(__file__).resolve().parents[1])


LEFT: list[int] = []
"""Bindings still on this loop's host tool server after the last ``_rollout``."""


def _rollout(task: vf.Task[Any], runtime: str = "subprocess", **kw: Any) -> vf.Trace:
    async def run() -> vf.Trace:
        trace = await vf.run_rollout(
            task, model="scripted:agent", harness="bash", runtime=runtime, **kw
        )
        server = host_server()
        LEFT[:] = [len(server.bindings), server.url is not None]
        return trace

    return asyncio.run(run())


def _plan(*steps: str) -> vf.TaskData:
    return vf.TaskData(prompt="\n".join(f"tool: {s}" for s in steps))


def test_tool_schema_comes_from_the_typed_parameters() -> None:
    specs = Faulty.specs()
    assert set(specs) == {"fine", "boom", "refuse", "hang", "hang_async", "huge"}
    fine = specs["fine"].as_mcp()
    assert fine["description"] == "Doubles x."
    assert fine["inputSchema"] == {
        "type": "object",
        "properties": {"x": {"type": "integer", "default": 1}},
        "additionalProperties": False,
    }


@pytest.mark.parametrize("in_box", [False, True], ids=["host", "box"])
def test_task_scoped_scratchpad_is_used_and_recorded(in_box: bool) -> None:
    task = ScratchpadTaskset(in_box=in_box).load()[1]
    trace = _rollout(task)
    assert trace.errors == []
    assert trace.rewards["remembered"].value == 1.0
    assert [(c.server, c.name) for c in trace.tool_calls] == [
        ("scratchpad", "write_note"),
        ("scratchpad", "read_note"),
    ]
    write, read = trace.tool_calls
    assert write.arguments == {"key": "n1", "text": "call Ada"}
    assert read.result == "call Ada" and read.error is None
    assert read.started_at >= write.ended_at > write.started_at
    # The model saw the tool's output: the agent's final answer carries it.
    assert trace.last_reply == "Done. call Ada"


def test_shared_glossary_keeps_each_rollouts_state_apart() -> None:
    task = GlossaryTaskset().load()[2]
    episode = asyncio.run(
        vf.run_episode(task, n=4, model="scripted:agent", harness="bash", runtime="subprocess")
    )
    for trace in episode.traces:
        assert trace.errors == []
        assert trace.rewards["defined"].value == 1.0
        # One lookup before the count, whatever the three sibling rollouts did meanwhile.
        assert trace.metrics["own_lookups"] == 1.0


def test_shared_toolset_is_one_instance_per_run_on_the_local_backend(tmp_path: Path) -> None:
    """Every rollout of a local run reaches the one instance, in the farm's own process, and
    each rollout's total stays its own (its number twice, whatever ran beside it)."""
    from tests.fixtures.tool_sets import census_tasks
    from vfray.traces.convert import table_to_traces

    with vf.Farm(
        model="scripted:agent",
        harness="bash",
        runtime="subprocess",
        backend="local",
        output_dir=str(tmp_path),
        progress=False,
        max_concurrent=8,
    ) as farm:
        result = farm.run(census_tasks(4), rollouts_per_task=2)
    instances = set()
    for trace in table_to_traces(result.final_traces):
        assert trace.errors == []
        add1, who, add2 = trace.tool_calls
        n = add1.arguments["n"]
        assert (add1.result, add2.result) == (str(n), str(2 * n))
        instances.add(who.result)
    (instance,) = instances
    assert instance is not None and int(instance.split("/")[0]) == os.getpid()


def _box_servers() -> set[int]:
    """Pids of in-box tool server programs now running on this machine."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if b"vfray.tools._box" in cmdline:
                found.add(int(entry))
    return found


@pytest.mark.parametrize("in_box", [False, True], ids=["host", "box"])
def test_faulty_tools_are_typed_errors_on_their_calls(in_box: bool) -> None:
    toolset = InBoxFaulty() if in_box else Faulty()
    steps = ["boom", "refuse", "hang", "hang_async", "huge", 'fine {"x": 21}']
    before = _box_servers()
    trace = _rollout(ToolTask(_plan(*steps), [toolset]))
    assert _box_servers() <= before  # the in-box server (its hung thread too) went with the box
    assert LEFT == [0, False]  # no binding left, and the host listener closed
    assert trace.errors == []  # the rollout itself went on to the end
    assert trace.stop_condition == vf.StopCondition.COMPLETED
    calls = {c.name: c for c in trace.tool_calls}
    assert list(calls) == ["boom", "refuse", "hang", "hang_async", "huge", "fine"]
    for name in ("boom", "refuse", "hang", "hang_async", "huge"):
        error = calls[name].error
        assert error is not None and error.type == "ToolError", name
    assert "RuntimeError: the tool blew up" in (calls["boom"].error.message or "")  # type: ignore[union-attr]
    assert "timed out after 1s" in calls["hang"].error.message  # type: ignore[union-attr]
    assert calls["hang_async"].duration < 5
    assert "10485760 characters" in calls["huge"].error.message  # type: ignore[union-attr]
    assert calls["huge"].result is not None and len(calls["huge"].result) < 1000
    assert calls["fine"].result == "42" and calls["fine"].error is None
    assert trace.last_reply == "Done. 42"


def test_intercept_rewrites_a_result_and_the_trace_keeps_both() -> None:
    trace = _rollout(ToolTask(_plan('secret {"who": "ada"}'), [Redacting()]))
    (call,) = trace.tool_calls
    assert call.result == "ada's password is [redacted]"
    assert call.original_result == "ada's password is hunter2"
    # What reached the model is the rewritten text.
    assert "hunter2" not in str(trace.messages)
    assert trace.last_reply == "Done. ada's password is [redacted]"


def test_external_stdio_server_by_command_is_served_and_recorded() -> None:
    server = McpServer(
        name="shouter",
        command=(sys.executable, f"{ROOT}/tests/fixtures/stdio_mcp.py"),
        env={"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
    )
    trace = _rollout(ToolTask(_plan('shout {"text": "hello"}'), [server]))
    assert trace.errors == []
    (call,) = trace.tool_calls
    assert (call.server, call.name, call.result) == ("shouter", "shout", "HELLO")
    assert trace.last_reply == "Done. HELLO"


@pytest.mark.parametrize(
    "source",
    [
        Unpicklable(),
        McpServer(name="gone", command=("false",)),
        McpServer(
            name="mute",
            command=(sys.executable, "-c", "import time; time.sleep(60)"),
            start_timeout=1,
        ),
    ],
    ids=["unpicklable", "exits", "never-answers"],
)
def test_a_tool_server_that_cannot_start_fails_setup_with_a_tool_error(source: Any) -> None:
    trace = _rollout(ToolTask(_plan("noop"), [source]))
    assert [(e.type, e.phase) for e in trace.errors] == [("ToolError", "setup")]
    assert trace.calls == []  # the agent never ran
    assert LEFT == [0, False]  # no binding left, and the host listener closed


def test_a_task_with_tools_and_a_harness_without_mcp_is_refused_before_anything_runs() -> None:
    task = ScratchpadTaskset().load()[0]
    with pytest.raises(IncompatibleError, match="cannot use MCP tools"):
        asyncio.run(vf.run_episode(task, n=1, model="scripted:agent", harness="null"))


@pytest.mark.bwrap
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
def test_bwrap_box_without_network_reaches_host_and_in_box_tools() -> None:
    """Default-deny egress: the host-side glossary through the interception's bridge, the
    in-box scratchpad on the box's own loopback (the worktree mounted for its imports)."""
    options = {"runtime_options": {"ro_binds": [ROOT]}}
    task = ScratchpadTaskset(in_box=True).load()[0]
    trace = _rollout(task, "bwrap", **options)
    assert trace.errors == [] and trace.rewards["remembered"].value == 1.0
    glossary = _rollout(GlossaryTaskset().load()[0], "bwrap", **options)
    assert glossary.errors == [] and glossary.rewards["defined"].value == 1.0
    assert len(glossary.tool_calls) == 3


def test_stop_hook_sees_the_pending_request_and_the_last_response() -> None:
    from examples.tools_scratchpad import Scratchpad
    from tests.fixtures.tool_sets import StopAfterStore

    task = StopAfterStore(
        _plan('write_note {"key": "k", "text": "t"}', 'read_note {"key": "k"}'), [Scratchpad()]
    )
    trace = _rollout(task)
    assert trace.stop_condition == vf.StopCondition.STOP_HOOK
    # Stopped before the model saw the first tool result: one call made, one tool call.
    assert [c.name for c in trace.tool_calls] == ["write_note"]
    assert len(trace.calls) == 1
    # First call: a request and no reply yet; second: the request and the assistant's reply.
    assert StopAfterStore.seen == [(True, None), (True, "assistant")]


def test_external_server_by_url_is_passed_to_the_agent(tmp_path: Path) -> None:
    """A server vfray does not run: the agent reaches it at its URL (its calls are the
    server's own business, so the trace records none)."""
    import pickle
    import subprocess

    (tmp_path / "spec.pkl").write_bytes(pickle.dumps(Faulty()))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    server = subprocess.Popen(
        [sys.executable, "-m", "vfray.tools._box", str(tmp_path / "spec.pkl"), "/dev/null"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert server.stdout is not None
        port = server.stdout.readline().split()[-1]
        remote = McpServer(name="remote", url=f"http://127.0.0.1:{port}/mcp/box")
        trace = _rollout(ToolTask(_plan('fine {"x": 4}'), [remote]))
    finally:
        server.terminate()
        server.wait(10)
    assert trace.errors == []
    assert trace.tool_calls == []
    assert trace.last_reply == "Done. 8"
