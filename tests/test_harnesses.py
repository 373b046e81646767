"""The harness contract and the built-in ``null``/``bash`` harnesses, run for real: the chat-loop
program in the subprocess runtime against the scripted model on 127.0.0.1."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from vfray.errors import (
    ConfigError,
    HarnessError,
    IncompatibleError,
    PhaseTimeoutError,
    SandboxError,
)
from vfray.harnesses import BashHarness, NullHarness, make_harness
from vfray.harnesses.base import Harness, LaunchContext, check_compatibility, classify_exit
from vfray.harnesses.chat import openai_base_url, parse_summary
from vfray.interception import Interception, Limits, Upstream
from vfray.models.scripted.server import ScriptedModel, scripted_server
from vfray.runtimes.base import ProgramResult, Runtime
from vfray.runtimes.registry import make_runtime
from vfray.runtimes.subprocess import SubprocessRuntime
from vfray.task import Task, TaskData
from vfray.trace import Message, StopCondition, Trace

PROGRAM = Path(__file__).parents[1] / "vfray" / "harnesses" / "programs" / "chat_loop.py"
FAST = ("--backoff", "0.01")


def load_program() -> ModuleType:
    spec = importlib.util.spec_from_file_location("vfray_chat_loop_under_test", PROGRAM)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


chat_loop = load_program()


@pytest.fixture
async def runtime() -> AsyncIterator[SubprocessRuntime]:
    box = SubprocessRuntime()
    await box.start()
    try:
        yield box
    finally:
        await box.stop()


@pytest.fixture
def echo_model() -> Iterator[tuple[ScriptedModel, str]]:
    model = ScriptedModel("echo")
    with scripted_server(model) as url:
        yield model, url


@pytest.fixture
def bash_model() -> Iterator[tuple[ScriptedModel, str]]:
    model = ScriptedModel("bash")
    with scripted_server(model) as url:
        yield model, url


def context(url: str, prompt: str | None, **data: Any) -> LaunchContext:
    return LaunchContext(
        endpoint=url,
        secret="rollout-secret",
        model="scripted",
        data=TaskData(prompt=prompt, **data),
    )


async def launched(harness: Harness, runtime: Runtime, ctx: LaunchContext) -> ProgramResult:
    await harness.setup(runtime)
    return await harness.launch(ctx, runtime)


# -- the built-in harnesses, end to end ----------------------------------------------------------


async def test_null_answers_an_echo_prompt(
    runtime: SubprocessRuntime, echo_model: tuple[ScriptedModel, str]
) -> None:
    model, url = echo_model
    harness = make_harness("null")
    result = await launched(
        harness, runtime, context(url, "hello there", system_prompt="Be brief.")
    )
    assert result.ok, result.stderr
    summary = parse_summary(result)
    assert summary is not None
    assert summary["chat_loop"] == "completed"
    assert summary["final"] == "hello there"
    assert summary["steps"] == 1
    (request,) = model.history
    assert request.headers["authorization"] == "Bearer rollout-secret"
    assert "tools" not in request.body
    # null appends the system prompt: it arrives as its own message.
    assert [m["role"] for m in request.body["messages"]] == ["system", "user"]


async def test_bash_runs_a_command_that_creates_a_file_in_the_box(
    runtime: SubprocessRuntime, bash_model: tuple[ScriptedModel, str]
) -> None:
    model, url = bash_model
    harness = make_harness("bash")
    ctx = context(
        url,
        "Create it: `echo made-by-agent > out/made.txt && pwd && echo ${VFRAY_API_KEY:-no-key}`",
    )
    await runtime.write("out/.keep", b"")
    result = await launched(harness, runtime, ctx)
    assert result.ok, result.stderr
    assert await runtime.read("out/made.txt") == b"made-by-agent\n"
    summary = parse_summary(result)
    assert summary is not None
    assert summary["chat_loop"] == "completed"
    assert summary["tool_calls"] == 1
    # The command ran in the box's work dir, and the model saw its output.
    assert summary["final"].split() == [str(runtime.workdir), "no-key"]
    tools = [t["function"]["name"] for t in model.history[0].body["tools"]]
    assert tools == ["bash", "edit"]
    transcript = await harness.read_transcript(runtime)
    assert transcript is not None
    assert [m.role for m in transcript] == ["user", "assistant", "tool", "assistant"]


@pytest.mark.bwrap
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
async def test_bash_harness_runs_in_the_isolated_bwrap_box(
    bash_model: tuple[ScriptedModel, str],
) -> None:
    _, url = bash_model
    box = make_runtime("bwrap")
    await box.start()
    try:
        harness = make_harness("bash")
        await harness.setup(box)
        endpoint = await box.host_url(url)
        await box.prepare_execution([endpoint])
        ctx = context(endpoint, "Run `echo boxed > f.txt && cat f.txt`")
        result = await harness.launch(ctx, box)
        assert result.ok, result.stderr
        assert await box.read("f.txt") == b"boxed\n"
        summary = parse_summary(result)
        assert summary is not None and summary["final"] == "boxed\n"
    finally:
        await box.stop()


async def test_bash_tool_output_is_cut_in_the_middle(
    runtime: SubprocessRuntime, bash_model: tuple[ScriptedModel, str]
) -> None:
    _, url = bash_model
    harness = BashHarness({"max_tool_output_chars": 1000})
    result = await launched(harness, runtime, context(url, "Count: `seq 1 100000`"))
    assert result.ok, result.stderr
    summary = parse_summary(result)
    assert summary is not None
    final = summary["final"]
    assert final.startswith("1\n2\n3\n")
    assert final.rstrip().endswith("99999\n100000")
    assert "characters truncated" in final
    assert len(final) < 1100


async def test_model_errors_are_retried_with_the_retry_count_header(
    runtime: SubprocessRuntime, echo_model: tuple[ScriptedModel, str]
) -> None:
    model, url = echo_model
    model.fail_next(503, times=2)
    harness = NullHarness({"extra_args": FAST})
    result = await launched(harness, runtime, context(url, "still there?"))
    assert result.ok, result.stderr
    assert [r.headers["x-stainless-retry-count"] for r in model.history] == ["0", "1", "2"]
    assert "retrying" in result.stderr


async def test_a_refused_call_fails_the_harness_with_its_stderr_tail(
    runtime: SubprocessRuntime, echo_model: tuple[ScriptedModel, str]
) -> None:
    model, url = echo_model
    model.fail_next(401)
    harness = NullHarness()
    result = await launched(harness, runtime, context(url, "hi"))
    assert result.exit_code == chat_loop.EXIT_ERROR
    error = classify_exit(result, runtime_alive=True, stopped_by_limit=False)
    assert isinstance(error, HarnessError)
    assert "HTTP 401" in str(error) and "exit code 2" in str(error)
    # Once a limit stopped the rollout, the same exit is clean.
    assert classify_exit(result, runtime_alive=True, stopped_by_limit=True) is None


async def test_a_crashing_program_is_a_harness_error(
    runtime: SubprocessRuntime, echo_model: tuple[ScriptedModel, str]
) -> None:
    _, url = echo_model
    harness = NullHarness()
    await harness.setup(runtime)
    # Break the installed program: the harness must report the traceback's tail.
    await runtime.write(
        ".vfray/chat_loop.py", b"import sys\nraise RuntimeError('agent exploded')\n"
    )
    result = await harness.launch(context(url, "hi"), runtime)
    error = classify_exit(result, runtime_alive=await runtime.alive(), stopped_by_limit=False)
    assert isinstance(error, HarnessError)
    assert "RuntimeError: agent exploded" in str(error)
    await runtime.stop()
    dead = classify_exit(result, runtime_alive=await runtime.alive(), stopped_by_limit=False)
    assert isinstance(dead, SandboxError)


def test_classify_exit_covers_clean_timeout_and_signals() -> None:
    assert classify_exit(ProgramResult(exit_code=0), True, False) is None
    timed_out = ProgramResult(exit_code=-9, timed_out=True, duration=3.0)
    assert isinstance(classify_exit(timed_out, True, False), PhaseTimeoutError)
    assert classify_exit(timed_out, True, True) is None
    killed = classify_exit(ProgramResult(exit_code=-9, stderr=""), True, False)
    assert isinstance(killed, HarnessError) and "SIGKILL" in str(killed)
    long = ProgramResult(exit_code=1, stderr="x" * 10_000 + "THE END")
    message = str(classify_exit(long, True, False))
    assert message.endswith("THE END") and len(message) < 2100


async def test_through_the_interception_a_limit_stop_is_a_clean_exit(
    runtime: SubprocessRuntime, bash_model: tuple[ScriptedModel, str]
) -> None:
    model, url = bash_model
    trace = Trace(task=Task(TaskData(prompt="x")).record())
    async with Interception(Upstream(url, model="scripted")) as icpt:
        secret = icpt.app.register(trace, Limits(max_turns=1))
        # The bare origin: the harness adds the /v1 itself.
        ctx = LaunchContext(
            endpoint=await runtime.host_url(icpt.root_url),
            secret=secret,
            model="scripted",
            data=TaskData(prompt="Run `echo one`"),
        )
        result = await launched(BashHarness(), runtime, ctx)
        recorded = icpt.app.conclude(secret)
    assert result.exit_code == 0, result.stderr
    assert "rollout stopped: max_turns" in result.stderr
    summary = parse_summary(result)
    assert summary is not None
    assert summary["chat_loop"] == "stopped"
    assert summary["tool_calls"] == 1
    assert recorded.stop_condition is StopCondition.MAX_TURNS
    assert recorded.num_turns == 1
    assert len(model.history) == 1  # the refused call never reached the model, and a 400
    assert classify_exit(result, True, recorded.stop_condition is not None) is None


async def test_through_the_interception_every_turn_is_recorded(
    runtime: SubprocessRuntime, bash_model: tuple[ScriptedModel, str]
) -> None:
    _, url = bash_model
    trace = Trace(task=Task(TaskData(prompt="x")).record())
    async with Interception(Upstream(url, model="scripted")) as icpt:
        secret = icpt.app.register(trace)
        ctx = LaunchContext(
            endpoint=await runtime.host_url(icpt.url),
            secret=secret,
            model="scripted",
            data=TaskData(prompt="Run `echo recorded`", system_prompt="sys"),
        )
        result = await launched(BashHarness(), runtime, ctx)
        recorded = icpt.app.conclude(secret)
    assert result.ok, result.stderr
    assert recorded.num_turns == 2
    assert len(recorded.branch_list) == 1  # the program sends replies back unchanged
    assert [m.role for m in recorded.messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    assert recorded.last_reply == "recorded\n"


# -- segments -------------------------------------------------------------------------------


# The segments of a whole rollout (launch, then resumes with the task's next messages) are
# tested through real rollouts in tests/test_segments.py.


async def test_resume_needs_the_capability(runtime: SubprocessRuntime) -> None:
    class OneShot(Harness):
        id = "one_shot"
        NEEDS_CONTAINER = False

        async def launch(self, ctx: LaunchContext, runtime: Runtime) -> ProgramResult:
            return await runtime.run(["true"])

    ctx = context("http://127.0.0.1:9", "x")
    assert (await OneShot().launch(ctx, runtime)).ok
    with pytest.raises(HarnessError, match="cannot resume"):
        await OneShot().resume(ctx, runtime, [Message(role="user", content="again")])


# -- prompts, config, registry, compatibility -----------------------------------------------


def test_system_prompt_is_folded_when_the_harness_does_not_append_it() -> None:
    class Folding(NullHarness):
        APPENDS_SYSTEM_PROMPT = False

    data = TaskData(prompt="Solve it.", system_prompt="You are terse.")
    assert NullHarness().resolve_prompt(data) == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Solve it."},
    ]
    assert Folding().resolve_prompt(data) == [
        {"role": "user", "content": "You are terse.\n\nSolve it."}
    ]
    parts = TaskData(
        prompt=[{"role": "user", "content": [{"type": "text", "text": "Q"}]}], system_prompt="S"
    )
    assert Folding().resolve_prompt(parts)[0]["content"][0] == {"type": "text", "text": "S"}
    assert Folding().resolve_prompt(TaskData(system_prompt="S")) == [
        {"role": "user", "content": "S"}
    ]


def test_registry_builds_harnesses_and_suggests_near_misses() -> None:
    assert isinstance(make_harness(), BashHarness)
    harness = make_harness("bash", {"max_steps": 3, "command_timeout": 5})
    assert harness.config.model_dump()["max_steps"] == 3
    assert isinstance(make_harness("vfray.harnesses.null:NullHarness"), NullHarness)
    with pytest.raises(ConfigError, match="did you mean 'bash'"):
        make_harness("bsh")
    with pytest.raises(ConfigError, match="did you mean 'null'"):
        make_harness("nul")
    with pytest.raises(ConfigError, match="invalid config for harness 'null'"):
        make_harness("null", {"max_stpes": 3})
    with pytest.raises(ConfigError, match="cannot import"):
        make_harness("no_such_module:Thing")


def test_incompatible_pairings_are_refused_with_reasons() -> None:
    class Containerised(Harness):
        id = "boxed"

        async def launch(self, ctx: LaunchContext, runtime: Runtime) -> ProgramResult:
            raise NotImplementedError

    check_compatibility(BashHarness, SubprocessRuntime, taskset_has_tools=False)
    with pytest.raises(IncompatibleError, match="needs a container"):
        check_compatibility(Containerised, SubprocessRuntime)
    with pytest.raises(IncompatibleError, match="cannot use MCP tools"):
        check_compatibility(NullHarness(), SubprocessRuntime, taskset_has_tools=True)
    with pytest.raises(IncompatibleError, match="cannot resume"):
        check_compatibility(Containerised, SubprocessRuntime, has_user=True)
    with pytest.raises(IncompatibleError, match="cannot run images"):
        check_compatibility(BashHarness, SubprocessRuntime, needs_image=True)


def test_flags_of_the_builtins() -> None:
    assert (NullHarness.EXECUTES_CODE, BashHarness.EXECUTES_CODE) == (False, True)
    for cls in (NullHarness, BashHarness):
        assert cls.APPENDS_SYSTEM_PROMPT and cls.SUPPORTS_RESUME and not cls.NEEDS_CONTAINER
    assert openai_base_url("http://h:1") == "http://h:1/v1"
    assert openai_base_url("http://h:1/v1/") == "http://h:1/v1"


# -- the program's tools, directly ----------------------------------------------------------


def test_bash_tool_bounds_a_flood_and_kills_a_hung_command() -> None:
    flood = chat_loop.run_bash("yes 0123456789 | head -c 5000000", timeout=30, limit=400)
    assert flood.startswith("0123456789\n")
    assert "characters truncated" in flood and len(flood) < 500
    hung = chat_loop.run_bash("echo started; sleep 30", timeout=0.3, limit=400)
    assert hung.startswith("started\n") and "timed out after 0.3 s" in hung
    failed = chat_loop.run_bash("echo oops >&2; exit 3", timeout=30, limit=400)
    assert failed == "oops\n\n[exit code 3]"


def test_edit_tool_creates_replaces_and_refuses_ambiguity(tmp_path: Path) -> None:
    target = tmp_path / "pkg" / "mod.py"
    assert chat_loop.run_edit(str(target), "a = 1\nb = 1\n", None).startswith("wrote")
    assert chat_loop.run_edit(str(target), "a = 2", "a = 1") == f"edited {target}"
    assert target.read_text() == "a = 2\nb = 1\n"
    assert "found 2 times" in chat_loop.run_edit(str(target), "x", " = ")
    assert "not found" in chat_loop.run_edit(str(target), "x", "zzz")
    assert "cannot read" in chat_loop.run_edit(str(tmp_path / "none.py"), "x", "y")


def test_bad_tool_calls_become_messages_for_the_model() -> None:
    args = chat_loop.parse_args(["--tools", "bash"])
    assert "unknown tool 'edit'" in chat_loop.call_tool("edit", "{}", ["bash"], args)
    assert "not valid JSON" in chat_loop.call_tool("bash", "{nope", ["bash"], args)
    assert "`command`" in chat_loop.call_tool("bash", json.dumps({"cmd": "ls"}), ["bash"], args)
