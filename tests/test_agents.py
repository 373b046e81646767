"""Real coding agents run on vfray: each harness installs its real program from PyPI/npm into the
node's tool dir (reused between runs: ``$VFRAY_TOOLS_DIR`` or ``~/.cache/vfray/tools``) and runs
a whole rollout against the scripted ``agent`` model through the interception; the task's reward
checks the file the agent wrote in the box. Skipped with the reason when a registry is offline.
"""

from __future__ import annotations

import asyncio
import json
import signal
import tomllib
from pathlib import Path
from typing import Any

import pytest
from agent_tools import need_registry

import vfray as vf
from vfray.errors import ConfigError, HarnessError
from vfray.harnesses import available_harnesses, make_harness
from vfray.harnesses.base import run_until_stopped
from vfray.harnesses.claude_code import ClaudeCodeConfig, anthropic_root
from vfray.harnesses.codex import CodexConfig, config_toml
from vfray.harnesses.mini_swe_agent import MiniSweAgentConfig, MiniSweAgentHarness
from vfray.harnesses.provisioned import ProvisionedHarness
from vfray.interception import Limits
from vfray.rollout import Timeouts
from vfray.runtimes.base import ProgramResult, Runtime
from vfray.runtimes.provision import ensure_tool
from vfray.runtimes.subprocess import SubprocessRuntime
from vfray.trace import AgentArtifact
from vfray.traces.convert import table_to_traces
from vfray.traces.io import read_traces, write_traces

PROMPT = 'Write "hello agent" to out.txt, then check it.'


class WriteFile(vf.Task[vf.TaskData]):
    """Solved when the box's out.txt holds the line the prompt asked for."""

    @vf.reward
    async def wrote_it(self, runtime: Runtime) -> bool:
        try:
            return (await runtime.read("out.txt")) == b"hello agent\n"
        except vf.SandboxError:
            return False  # not written: a 0, not a reward hook that broke


def _timed_install(harness_id: str) -> float:
    """Provision the harness's program outside any rollout; returns the seconds it took."""
    harness = make_harness(harness_id)
    assert isinstance(harness, ProvisionedHarness)
    tool = ensure_tool(harness.tool_spec(), harness.tools_root)
    print(f"{harness_id}: tool dir {tool.path} ready in {tool.seconds:.1f}s")
    return tool.seconds


async def _rollout(harness_id: str, runtime: str = "subprocess", **options: Any) -> vf.Trace:
    # Not bwrap's default /work: a host venv under /work (this machine's) would be hidden.
    data = vf.TaskData(prompt=PROMPT, workdir="/box" if runtime == "bwrap" else None)
    return await vf.run_rollout(
        WriteFile(data),
        model="scripted:agent",
        harness=harness_id,
        runtime=runtime,
        **options,
    )


def _check_solved(trace: vf.Trace, calls: int) -> None:
    assert trace.errors == [], trace.errors
    assert trace.stop_condition is vf.StopCondition.COMPLETED
    assert trace.rewards["wrote_it"].value == 1.0
    assert len(trace.calls) == calls, [c.error for c in trace.calls]
    assert all(c.error is None for c in trace.calls)


# -- mini-swe-agent --------------------------------------------------------------------------


def test_agent_harnesses_are_registered_with_typed_configs() -> None:
    assert {"mini-swe-agent", "codex", "claude-code"} <= set(available_harnesses())
    codex = make_harness("codex", {"reasoning_effort": "low", "env": {"RUST_LOG": "warn"}})
    assert isinstance(codex.config, CodexConfig) and codex.config.version == "0.171.0"
    claude = make_harness("claude-code", {"allowed_tools": ["Bash"]})
    assert isinstance(claude.config, ClaudeCodeConfig) and claude.config.allowed_tools == ("Bash",)
    for harness in (codex, claude):
        assert harness.EXECUTES_CODE and not harness.NEEDS_CONTAINER
    with pytest.raises(ConfigError, match="codex"):
        make_harness("codex", {"no_such_option": 1})


def test_codex_config_points_its_provider_at_the_interception() -> None:
    config = tomllib.loads(config_toml("scripted:agent", "http://127.0.0.1:9/v1", "low"))
    assert config["model"] == "scripted:agent" and config["model_provider"] == "vfray"
    assert config["check_for_update_on_startup"] is False
    assert config["analytics"] == {"enabled": False} and config["feedback"] == {"enabled": False}
    assert config["model_reasoning_effort"] == "low"
    assert config["model_providers"]["vfray"] == {
        "name": "vfray",
        "base_url": "http://127.0.0.1:9/v1",
        "env_key": "VFRAY_API_KEY",
        "wire_api": "responses",
    }


def test_claude_code_gets_the_interception_root_without_v1() -> None:
    assert anthropic_root("http://127.0.0.1:9/v1") == "http://127.0.0.1:9"
    assert anthropic_root("http://127.0.0.1:9/v1/") == "http://127.0.0.1:9"
    assert anthropic_root("http://127.0.0.1:9") == "http://127.0.0.1:9"


def test_mini_swe_agent_config_is_typed() -> None:
    harness = make_harness("mini-swe-agent", {"version": "2.4.6", "extra_args": ["--foo"]})
    assert isinstance(harness, MiniSweAgentHarness)
    assert isinstance(harness.config, MiniSweAgentConfig)
    assert harness.EXECUTES_CODE and not harness.NEEDS_CONTAINER
    with pytest.raises(ConfigError, match="mini-swe-agent"):
        make_harness("mini-swe-agent", {"max_steps": 0})


@pytest.mark.slow
async def test_mini_swe_agent_text_protocol_rollout() -> None:
    """mini-swe-agent's text-based config: no tool schemas, one fenced block per reply."""
    need_registry("pypi")
    _timed_install("mini-swe-agent")
    trace = await _rollout(
        "mini-swe-agent",
        harness_options={"mini_config": "mini_textbased", "model_class": "litellm_textbased"},
    )
    _check_solved(trace, calls=3)
    assert all(not call.tools for call in trace.calls)


@pytest.mark.slow
async def test_mini_swe_agent_rollout_writes_the_file() -> None:
    need_registry("pypi")
    _timed_install("mini-swe-agent")
    trace = await _rollout("mini-swe-agent")
    # write, cat, submit: three model calls, all recorded by the interception.
    _check_solved(trace, calls=3)
    (artifact,) = trace.artifacts
    assert artifact.name == "trajectory.json" and not artifact.truncated
    trajectory = json.loads(artifact.content)
    assert trajectory["info"]["exit_status"] == "Submitted"
    commands = [
        json.loads(call["function"]["arguments"])["command"]
        for m in trajectory["messages"]
        for call in m.get("tool_calls") or []
    ]
    assert commands[1:] == ["cat out.txt", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"]


@pytest.mark.slow
@pytest.mark.bwrap
@pytest.mark.parametrize(
    ("harness_id", "registry"),
    [("mini-swe-agent", "pypi"), ("codex", "npm"), ("claude-code", "npm")],
)
async def test_agent_rollout_in_bwrap(harness_id: str, registry: str) -> None:
    """The tool dir is bound read-only into the box; the agent runs with no network but the
    interception's bridge."""
    need_registry(registry)
    _timed_install(harness_id)
    trace = await _rollout(harness_id, runtime="bwrap")
    _check_solved(trace, calls=3)


async def test_agent_harness_refuses_a_runtime_without_the_tool_dir() -> None:
    # A runtime that neither sees the node's tool dir nor builds tools into its image (modal
    # does: tests/test_runtime_modal.py).
    class Elsewhere(SubprocessRuntime):
        type = "elsewhere"

    harness = make_harness("mini-swe-agent")
    with pytest.raises(HarnessError, match="cannot mount; use 'modal' or 'subprocess'"):
        await harness.setup(Elsewhere())


# -- codex -----------------------------------------------------------------------------------


@pytest.mark.slow
async def test_codex_rollout_writes_the_file() -> None:
    need_registry("npm")
    _timed_install("codex")
    trace = await _rollout("codex")
    # write, cat, final answer: three Responses calls.
    _check_solved(trace, calls=3)
    (artifact,) = trace.artifacts
    events = [json.loads(line) for line in artifact.content.splitlines() if line.strip()]
    assert events[-1]["type"] == "turn.completed"


@pytest.mark.slow
async def test_an_episode_of_concurrent_rollouts_shares_one_tool_dir() -> None:
    need_registry("npm")
    _timed_install("codex")
    episode = await vf.run_episode(
        WriteFile(vf.TaskData(prompt=PROMPT)), n=3, model="scripted:agent", harness="codex"
    )
    assert [t.reward for t in episode.traces] == [1.0, 1.0, 1.0]
    assert all(len(t.calls) == 3 for t in episode.traces)


# -- claude-code -----------------------------------------------------------------------------


@pytest.mark.slow
async def test_claude_code_rollout_writes_the_file() -> None:
    need_registry("npm")
    _timed_install("claude-code")
    trace = await _rollout("claude-code")
    _check_solved(trace, calls=3)
    (artifact,) = trace.artifacts
    events = [json.loads(line) for line in artifact.content.splitlines() if line.strip()]
    assert events[-1]["type"] == "result" and events[-1]["subtype"] == "success"


# -- stop means stop -------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("harness_id", "registry", "options"),
    [
        # mini-swe-agent's own default: 10 attempts with backoff (284 s measured before).
        ("mini-swe-agent", "pypi", {"model_retries": 10}),
        ("codex", "npm", {}),
        ("claude-code", "npm", {}),
    ],
)
async def test_a_refused_call_ends_the_agent_program(
    harness_id: str, registry: str, options: dict[str, Any]
) -> None:
    """After the interception refuses a call (max_turns=1) the program is ended within the stop
    grace, not left retrying: the rollout ends by its limit, before the agent budget (which
    would record a timeout instead)."""
    need_registry(registry)
    _timed_install(harness_id)
    trace = await _rollout(
        harness_id,
        harness_options=options,
        limits=Limits(max_turns=1),
        timeouts=Timeouts(agent=90),
    )
    assert trace.stop_condition is vf.StopCondition.MAX_TURNS, (trace.stop_condition, trace.notes)
    assert trace.stop_condition.truncated
    assert trace.errors == []
    assert len(trace.calls) == 1
    assert not [note for note in trace.notes if "agent budget" in note], trace.notes
    agent = trace.timing["agent"].duration
    after = trace.timing["agent"].end - trace.calls[-1].ended_at
    print(f"{harness_id}: max_turns=1 rollout's agent phase took {agent:.1f}s, {after:.1f}s after")
    # The refused call follows the answered one at once; SIGTERM then ends the program. A
    # hang check, generous for a loaded machine, not a performance bound.
    assert after < 30, after


KEY_VARS = {
    "mini-swe-agent": "OPENAI_API_KEY",
    "codex": "VFRAY_API_KEY",
    "claude-code": "ANTHROPIC_API_KEY",
    "aider": "OPENAI_API_KEY",
}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("harness_id", "registry", "options"),
    [
        ("mini-swe-agent", "pypi", {"model_retries": 10}),
        ("codex", "npm", {}),
        ("claude-code", "npm", {}),
        ("aider", "pypi", {}),  # exits 0 after the refusal: its history says the call failed
    ],
)
async def test_an_unknown_key_ends_the_agent_by_itself(
    harness_id: str, registry: str, options: dict[str, Any]
) -> None:
    """An unknown (expired, concluded) key gets the dialect's final status, which the agent
    gives up on at once: Claude Code retried a 401 for the whole agent budget."""
    need_registry(registry)
    _timed_install(harness_id)
    env = {KEY_VARS[harness_id]: "sk-vfray-unknown-key"}
    trace = await _rollout(
        harness_id, harness_options={**options, "env": env}, timeouts=Timeouts(agent=120)
    )
    assert not [note for note in trace.notes if "agent budget" in note], trace.notes
    assert [e.type for e in trace.errors] == ["HarnessError"], trace.errors
    assert trace.calls == []
    agent = trace.timing["agent"].duration
    print(f"{harness_id}: an unknown key ended the agent phase in {agent:.1f}s")
    assert agent < 90, agent  # a hang check (the budget is 120 s), not a performance bound


async def test_a_program_that_ignores_the_stop_is_killed_after_the_grace() -> None:
    """``run_until_stopped`` with a real process group that would run for a minute: the stop
    lets it run out the grace, then the whole group (a forked child included) is gone."""
    flag = {"stopped": False}
    async with SubprocessRuntime() as box:
        program = box.run_program(
            ["sh", "-c", "sleep 60 & echo $! > child.pid; wait"], {}, timeout=120
        )

        async def stop_soon() -> None:
            await asyncio.sleep(0.5)
            flag["stopped"] = True

        stopper = asyncio.ensure_future(stop_soon())
        result = await run_until_stopped(program, lambda: flag["stopped"], grace=0.5)
        await stopper
        assert result.exit_code == -signal.SIGKILL
        assert result.stderr.startswith("killed ")
        assert result.stderr.endswith("after the rollout was stopped")
        child = int((await box.read("child.pid")).decode())
    assert not _running(child)


def _running(pid: int) -> bool:
    """Alive and not a zombie (a killed orphan waits for this container's init to reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def test_a_program_that_ends_within_the_grace_keeps_its_result() -> None:
    async with SubprocessRuntime() as box:
        program = box.run_program(["sh", "-c", "sleep 0.5; echo bye"], {}, timeout=30)
        result = await run_until_stopped(program, lambda: True, grace=20)
        assert result.ok and result.stdout == "bye\n"


def test_agent_artifacts_survive_the_run_folders_parquet(tmp_path: Path) -> None:
    trace = vf.Trace(task=WriteFile(vf.TaskData(prompt=PROMPT)).record())
    trace.artifacts.append(AgentArtifact(name="trajectory.json", content='{"a": 1}'))
    write_traces([trace], tmp_path / "traces.parquet")
    (back,) = table_to_traces(read_traces(tmp_path / "traces.parquet"))
    assert back.artifacts == trace.artifacts


@pytest.mark.parametrize("kind", ["subprocess", "bwrap"])
async def test_a_stopped_program_gets_sigterm_then_sigkill(kind: str) -> None:
    """With the box's ``interrupt`` the stop SIGTERMs the program at once: one that cleans up
    on SIGTERM ends with its own result well inside the grace; one that ignores it is killed
    when the grace is up."""
    from vfray.runtimes.registry import make_runtime

    polite = 'trap "echo cleaned up; exit 0" TERM; touch ready; while true; do sleep 0.1; done'
    stubborn = 'trap "" TERM; touch ready; while true; do sleep 0.1; done'
    async with make_runtime(kind) as box:
        # Stopped once its trap is set: a SIGTERM before it would end the shell outright.
        ready = Path(getattr(box, "workdir")) / "ready"  # noqa: B009 - not on Runtime
        program = box.run_program(["sh", "-c", polite], {}, timeout=120)
        result = await run_until_stopped(program, ready.exists, grace=60, interrupt=box.interrupt)
        assert result.ok and result.stdout == "cleaned up\n", result
        ready.unlink()
        program = box.run_program(["sh", "-c", stubborn], {}, timeout=120)
        result = await run_until_stopped(program, ready.exists, grace=1, interrupt=box.interrupt)
        assert result.exit_code == -signal.SIGKILL and result.stderr.startswith("killed "), result


@pytest.mark.parametrize("kind", ["subprocess", "bwrap"])
async def test_a_program_stopped_while_it_starts_still_gets_sigterm(kind: str) -> None:
    """Stopped before its program runs (waiting for a launch slot, or bwrap still setting up
    the box: CI saw it under load), the SIGTERM found no process and the program ran on until
    the grace was up. It is now sent again until it reaches the program."""
    from vfray.runtimes.registry import make_runtime

    async with make_runtime(kind) as box:

        async def starts_late() -> ProgramResult:
            await asyncio.sleep(1.0)  # past the first look at the stop (STOP_POLL)
            return await box.run_program(["sleep", "300"], {}, timeout=120)

        result = await run_until_stopped(
            starts_late(), lambda: True, grace=20, interrupt=box.interrupt
        )
        assert result.exit_code in (-signal.SIGTERM, 128 + signal.SIGTERM), result
