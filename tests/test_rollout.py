"""Rollouts end to end on real runtimes with the scripted model: every phase timed, failures
recorded as typed errors, partial trajectories scored, and no box process left behind.

Misbehaving agents are real programs (``python -c``) run in the box by a small test harness.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from docker_engine import IMAGE, VOLUMES
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

import vfray as vf
from vfray.endpoints.serving import serve_in_loop
from vfray.errors import ConfigError, IncompatibleError
from vfray.harnesses.base import Harness, LaunchContext
from vfray.harnesses.chat import openai_base_url
from vfray.harnesses.registry import register_harness
from vfray.interception import Limits
from vfray.rollout import PHASES, Timeouts
from vfray.runtimes.base import ProgramResult, Runtime
from vfray.runtimes.strays import marked_pids

HAS_BWRAP = shutil.which("bwrap") is not None
LOCAL = [
    "subprocess",
    pytest.param(
        "bwrap", marks=[pytest.mark.bwrap, pytest.mark.skipif(not HAS_BWRAP, reason="no bwrap")]
    ),
]

PROGRAM = r"""
import json, os, signal, sys, time, urllib.request

def ask(text):
    body = {"model": os.environ["VFRAY_MODEL"], "messages": [{"role": "user", "content": text}]}
    request = urllib.request.Request(
        os.environ["VFRAY_BASE_URL"] + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Authorization": "Bearer " + os.environ["VFRAY_API_KEY"],
                 "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)["choices"][0]["message"]["content"]

behaviour = sys.argv[1]
if behaviour == "probe":
    try:
        urllib.request.urlopen(os.environ["PROBE_URL"], timeout=5).read()
        outcome = "reached"
    except Exception as exc:
        outcome = "refused " + type(exc).__name__ + " " + str(exc)
    ask("probe " + outcome)
    sys.exit(0)
print("reply:", ask(os.environ["PROMPT"]), flush=True)
if behaviour == "crash":
    print("boom: the agent fell over", file=sys.stderr)
    sys.exit(3)
if behaviour == "hang":
    time.sleep(300)
if behaviour == "flood":
    line = "x" * 1023 + "\n"
    for _ in range(20000):
        sys.stdout.write(line)
        sys.stderr.write(line)
if behaviour == "fork":
    for _ in range(3):
        if os.fork() == 0:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            os.setsid()  # out of the process group: only the box marker or namespace finds it
            time.sleep(300)
            os._exit(0)
"""


class ProbeData(vf.TaskData):
    behaviour: str = "ok"
    """What the test harness's program does after its one model call (see PROGRAM)."""


@register_harness
class ProgramHarness(Harness):
    """Runs PROGRAM in the box; remembers each task's box id so tests can look for leftovers."""

    id = "test_program"
    NEEDS_CONTAINER = False
    boxes: dict[str, str] = {}  # shared: make_harness builds the instance

    async def launch(self, ctx: LaunchContext, runtime: Runtime) -> ProgramResult:
        behaviour = ctx.data.behaviour if isinstance(ctx.data, ProbeData) else "ok"
        self.boxes[ctx.data.prompt_text] = str(getattr(runtime, "box_id", ""))
        env = {
            **self.config.env,
            "VFRAY_BASE_URL": openai_base_url(ctx.endpoint),
            "VFRAY_API_KEY": ctx.secret,
            "VFRAY_MODEL": ctx.model,
            "PROMPT": ctx.data.prompt_text,
        }
        argv = [sys.executable, "-c", PROGRAM, behaviour]
        return await runtime.run_program(argv, env, timeout=ctx.timeout)


@register_harness
class BadSetupHarness(ProgramHarness):
    id = "test_bad_setup"

    async def setup(self, runtime: Runtime) -> None:
        raise ValueError("the agent's installer broke")


class EchoTask(vf.Task[ProbeData]):
    """With the ``echo`` model the agent's one reply is its prompt."""

    @vf.reward
    def answered(self, trace: vf.Trace) -> bool:
        return trace.last_reply == self.data.prompt_text

    @vf.metric
    def turns(self, trace: vf.Trace) -> int:
        return trace.num_turns


class BrokenSetupTask(EchoTask):
    def setup(self, trace: vf.Trace, runtime: Runtime) -> None:
        raise RuntimeError("the task's fixtures are missing")


class SpiedTask(EchoTask):
    scored: list[str] = []  # what the hook saw, for the test

    @vf.reward
    def answered(self, trace: vf.Trace) -> bool:
        self.scored.append(self.key)
        return super().answered(trace)


class RankedTask(EchoTask):
    @vf.group_reward(weight=0.5)
    def rank(self, traces: list[vf.Trace]) -> list[float]:
        return [i / (len(traces) - 1) for i in range(len(traces))]


def probe_task(name: str, behaviour: str = "ok", cls: type[EchoTask] = EchoTask) -> EchoTask:
    return cls(ProbeData(prompt=name, behaviour=behaviour), key=name)


async def no_box_left(box_id: str) -> list[int]:
    """PIDs still carrying the box marker, after giving killed processes time to be reaped."""
    for _ in range(500):  # bounded generously: a loaded CI machine reaps slowly
        if not marked_pids(box_id):
            break
        await asyncio.sleep(0.02)
    return marked_pids(box_id)


def assert_all_phases_timed(trace: vf.Trace) -> None:
    # A task with an image has its own first phase, "image" (the node making it present).
    assert set(trace.timing) - {"image"} == set(PHASES), trace.timing
    for phase in trace.timing.values():
        assert phase.end is not None and phase.end >= phase.start


# -- the built-in harnesses on every runtime --------------------------------------------------


class SixByNine(vf.Task[vf.TaskData]):
    @vf.reward
    def says_54(self, trace: vf.Trace) -> bool:
        return "54" in (trace.last_reply or "")


BUILTIN_CASES = {
    # harness: (model, prompt): null answers in one turn, bash runs the command then answers.
    "null": ("scripted:arithmetic", "What is 6 times 9?"),
    "bash": ("scripted:bash", "Run `echo $((6 * 9))` and report what it prints."),
}


async def run_builtin(harness: str, runtime: str, **runtime_options: Any) -> vf.Trace:
    model, prompt = BUILTIN_CASES[harness]
    image = IMAGE if runtime == "docker" else None
    task = SixByNine(vf.TaskData(prompt=prompt, image=image))
    return await vf.run_rollout(
        task, model=model, harness=harness, runtime=runtime, runtime_options=runtime_options
    )


def check_builtin(trace: vf.Trace, harness: str) -> None:
    assert trace.ok, trace.errors
    assert trace.stop_condition is vf.StopCondition.COMPLETED
    assert trace.reward == 1.0
    assert trace.num_turns == (1 if harness == "null" else 2)
    assert_all_phases_timed(trace)


@pytest.mark.parametrize("runtime", LOCAL)
@pytest.mark.parametrize("harness", ["null", "bash"])
async def test_builtin_harness_on_local_runtime(harness: str, runtime: str) -> None:
    check_builtin(await run_builtin(harness, runtime), harness)


@pytest.mark.docker
@pytest.mark.parametrize("harness", ["null", "bash"])
async def test_builtin_harness_on_docker(harness: str, docker_url: str) -> None:
    trace = await run_builtin(
        harness,
        "docker",
        base_url=docker_url,
        volumes=dict(VOLUMES),
    )
    check_builtin(trace, harness)


# -- misbehaving agents ----------------------------------------------------------------------


def program_env(runtime: str, **options: Any) -> vf.LocalEnvironment:
    options.setdefault("model", "scripted:echo")
    options.setdefault("harness", ProgramHarness.id)
    return vf.LocalEnvironment(runtime=runtime, **options)


@pytest.mark.parametrize("runtime", LOCAL)
async def test_crashing_harness_is_a_harness_error_and_is_torn_down(runtime: str) -> None:
    async with program_env(runtime) as env:
        trace = await env.rollout(probe_task(f"crash-{runtime}", "crash"))
    first = trace.error()
    assert first is not None and first.type == "HarnessError" and first.phase == "agent"
    assert "boom: the agent fell over" in first.message and "exit code 3" in first.message
    assert trace.stop_condition is vf.StopCondition.ERROR
    # The one call it made is data: scoring still ran on it, then teardown.
    assert trace.rewards["answered"].value == 1.0
    assert_all_phases_timed(trace)
    assert await no_box_left(ProgramHarness.boxes[f"crash-{runtime}"]) == []


@pytest.mark.parametrize("runtime", LOCAL)
async def test_hanging_harness_hits_agent_timeout_and_partial_trajectory_is_scored(
    runtime: str,
) -> None:
    async with program_env(runtime, timeouts=Timeouts(agent=5)) as env:
        trace = await env.rollout(probe_task(f"hang-{runtime}", "hang"))
    assert trace.stop_condition is vf.StopCondition.TIMEOUT
    assert trace.stop_condition.truncated
    assert trace.num_turns == 1
    assert trace.reward == 1.0 and trace.metrics["turns"] == 1
    assert_all_phases_timed(trace)
    assert await no_box_left(ProgramHarness.boxes[f"hang-{runtime}"]) == []


@pytest.mark.parametrize("runtime", LOCAL)
async def test_flooding_harness_does_not_hang(runtime: str) -> None:
    async with program_env(runtime) as env:
        trace = await env.rollout(probe_task(f"flood-{runtime}", "flood"))
    assert trace.ok, trace.errors
    assert trace.stop_condition is vf.StopCondition.COMPLETED and trace.reward == 1.0


@pytest.mark.parametrize("runtime", LOCAL)
async def test_forked_processes_ignoring_sigterm_are_gone_after_rollout(runtime: str) -> None:
    async with program_env(runtime) as env:
        trace = await env.rollout(probe_task(f"fork-{runtime}", "fork"))
    assert trace.ok, trace.errors
    assert await no_box_left(ProgramHarness.boxes[f"fork-{runtime}"]) == []


async def _hello(request: Request) -> PlainTextResponse:
    return PlainTextResponse("hello from host")


@pytest.mark.bwrap
@pytest.mark.skipif(not HAS_BWRAP, reason="no bwrap")
async def test_bwrap_agent_reaches_model_but_not_other_host_ports() -> None:
    async with serve_in_loop(Starlette(routes=[Route("/hi", _hello)])) as other:
        options = {"env": {"PROBE_URL": f"{other}/hi"}}
        async with program_env("bwrap", harness_options=options) as env:
            trace = await env.rollout(probe_task("probe-bwrap", "probe"))
    assert trace.ok, trace.errors
    # The echo model repeats what the program found: the model was reached, the port was not.
    assert trace.last_reply is not None
    assert trace.last_reply.startswith("probe refused"), trace.last_reply
    assert "Connection refused" in trace.last_reply


@pytest.mark.parametrize("runtime", LOCAL)
async def test_failed_task_setup_skips_agent_and_scoring(runtime: str) -> None:
    async with program_env(runtime) as env:
        trace = await env.rollout(probe_task(f"setup-{runtime}", cls=BrokenSetupTask))
    first = trace.error()
    assert first is not None and first.type == "TaskError" and first.phase == "setup"
    assert "fixtures are missing" in first.message
    assert set(trace.timing) == {"boot", "setup", "teardown"}
    assert trace.rewards == {} and trace.reward is None and trace.calls == []


async def test_failed_harness_setup_is_a_harness_error() -> None:
    async with program_env("subprocess", harness=BadSetupHarness.id) as env:
        trace = await env.rollout(probe_task("bad-harness-setup"))
    first = trace.error()
    assert first is not None and (first.type, first.phase) == ("HarnessError", "setup")
    assert "installer broke" in first.message
    assert set(trace.timing) == {"boot", "setup", "teardown"} and trace.rewards == {}


async def test_failed_boot_is_a_sandbox_error(tmp_path: Path) -> None:
    missing = str(tmp_path / "no" / "such" / "root")
    async with program_env("subprocess", runtime_options={"root": missing}) as env:
        trace = await env.rollout(probe_task("bad-boot"))
    first = trace.error()
    assert first is not None and (first.type, first.phase) == ("SandboxError", "boot")
    assert set(trace.timing) == {"boot", "teardown"} and trace.reward is None


async def test_limit_stop_scores_partial_trajectory_without_error() -> None:
    task = SixByNine(vf.TaskData(prompt="Run `echo $((6 * 9))` and report what it prints."))
    trace = await vf.run_rollout(
        task,
        model="scripted:bash",
        harness="bash",
        runtime="subprocess",
        limits=Limits(max_turns=1),
    )
    assert trace.stop_condition is vf.StopCondition.MAX_TURNS
    assert trace.errors == []
    assert trace.num_turns == 1
    # Scored: the reward has a value (the tool call alone never said 54).
    assert trace.rewards["says_54"].value == 0.0
    assert_all_phases_timed(trace)


@pytest.mark.parametrize("runtime", LOCAL)
async def test_cancelled_rollout_tears_down_and_reraises(runtime: str) -> None:
    name = f"cancel-{runtime}"
    async with program_env(runtime) as env:
        rollout = asyncio.ensure_future(env.rollout(probe_task(name, "hang", SpiedTask)))
        # Cancel only once the agent program is really running in the box.
        for _ in range(3000):
            box = ProgramHarness.boxes.get(name)
            if box and marked_pids(box):
                break
            await asyncio.sleep(0.02)
        else:
            pytest.fail("the agent program never started")
        rollout.cancel()
        with pytest.raises(asyncio.CancelledError):
            await rollout
    assert await no_box_left(ProgramHarness.boxes[name]) == []
    assert name not in SpiedTask.scored  # a cancelled rollout is torn down, not scored


async def test_concurrent_rollouts_are_isolated_from_crashing_siblings() -> None:
    crashing = {3, 9, 14}
    tasks = [probe_task(f"many-{i}", "crash" if i in crashing else "ok") for i in range(20)]
    async with program_env("subprocess") as env:
        traces = await asyncio.gather(*(env.rollout(task) for task in tasks))
    for i, trace in enumerate(traces):
        assert trace.task.key == f"many-{i}"
        if i in crashing:
            assert [e.type for e in trace.errors] == ["HarnessError"]
        else:
            assert trace.ok, trace.errors
            assert trace.stop_condition is vf.StopCondition.COMPLETED and trace.reward == 1.0


async def test_run_episode_applies_group_rewards() -> None:
    task = probe_task("episode", cls=RankedTask)
    episode = await vf.run_episode(
        task, n=3, model="scripted:echo", harness="test_program", runtime="subprocess"
    )
    assert episode.group_rewards == {"rank": [0.0, 0.5, 1.0]}
    assert [t.rollout_index for t in episode.traces] == [0, 1, 2]
    assert episode.rewards == [1.0, 1.25, 1.5]
    for trace in episode.traces:
        assert trace.rewards["rank"].group and trace.episode_id == episode.episode_id
    advantages = [a for a in episode.advantages if a is not None]
    assert len(advantages) == 3 and abs(sum(advantages)) < 1e-9
    with pytest.raises(ConfigError, match="n must be at least 2"):
        await vf.run_episode(task, n=1, model="scripted:echo", harness="test_program")


def test_timeouts_take_the_tasks_own_deadlines() -> None:
    data = vf.TaskData(prompt="x", timeout={"agent": 5})
    merged = Timeouts(agent=100, scoring=7).for_task(data)
    assert (merged.agent, merged.scoring) == (5, 7)
    assert Timeouts().for_task(vf.TaskData(prompt="x")) == Timeouts()


class ContainerOnlyHarness(ProgramHarness):
    id = "test_container_only"
    NEEDS_CONTAINER = True


def test_environment_refuses_incompatible_pairs_up_front() -> None:
    register_harness(ContainerOnlyHarness)
    with pytest.raises(IncompatibleError, match="needs a container"):
        vf.LocalEnvironment(harness=ContainerOnlyHarness.id, runtime="subprocess")
    with pytest.raises(ConfigError, match="unknown runtime"):
        vf.LocalEnvironment(harness="null", runtime="no-such-runtime")
