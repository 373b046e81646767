"""Users in real rollouts: a ``@vf.user`` method or a model-backed ``vf.SimulatedUser`` opens a
prompt-less task and drives its segments, ``max_user_turns`` cuts it short, the simulated
user's calls stay out of the agent's calls and samples, and a user that fails is a typed error
on its own trace. Scripted model (the agent, the user and the judge), null harness; the
support-dialogue example also in bwrap, and on Ray (host and serve interception)."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import psutil
import pytest

import vfray as vf
from vfray._plugins import load_object
from vfray.errors import ConfigError, IncompatibleError
from vfray.farm import Farm
from vfray.harnesses.users import declared_user
from vfray.interception import Limits
from vfray.models.scripted.server import ScriptedModel, scripted_server
from vfray.rollout import run_planned_rollout
from vfray.run.broker import InProcessBroker
from vfray.run.environment import LocalEnvironment
from vfray.traces import to_samples, write_traces
from vfray.traces.convert import table_to_traces, traces_to_table

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
HAS_BWRAP = shutil.which("bwrap") is not None


def texts(trace: vf.Trace, call: int) -> list[tuple[str, str]]:
    return [(trace.graph[i].role, trace.graph[i].text) for i in trace.calls[call].request_ids]


def chat_loops() -> list[psutil.Process]:
    """Harness programs still running under this process."""
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if any("chat_loop" in part for part in proc.cmdline()):
                found.append(proc)
        except psutil.Error:
            continue
    return found


class Scripted(vf.Task[vf.TaskData]):
    """Says each of ``lines`` in turn, then None; notes the calls it saw each time."""

    def __init__(self, data: vf.TaskData, lines: list[str]) -> None:
        super().__init__(data)
        self.lines = list(lines)
        self.seen: list[int] = []

    @vf.user
    def customer(self, trace: vf.Trace) -> str | None:  # sync: runs on a hook thread
        self.seen.append(len(trace.calls))
        return self.lines.pop(0) if self.lines else None


async def test_a_user_hook_opens_a_prompt_less_task_and_closes_it() -> None:
    task = Scripted(vf.TaskData(prompt=None, system_prompt="S"), ["hello", "and more"])
    trace = await vf.run_rollout(task, model="scripted:echo", harness="null")
    assert trace.errors == [], trace.errors
    assert trace.stop_condition is vf.StopCondition.USER_CLOSED
    assert trace.stop_condition.terminated and not trace.stop_condition.truncated
    assert task.seen == [0, 1, 2] and len(trace.segments) == 2
    assert texts(trace, 0) == [("system", "S"), ("user", "hello")]
    assert texts(trace, 1)[-1] == ("user", "and more") and trace.last_reply == "and more"


async def test_an_async_user_gets_the_task_injected() -> None:
    class Asker(vf.Task[vf.TaskData]):
        @vf.user
        async def person(self, task: vf.Task[Any], trace: vf.Trace) -> str | None:
            assert task is self
            return None if trace.calls else "only this"

    trace = await vf.run_rollout(Asker(vf.TaskData()), model="scripted:echo", harness="null")
    assert trace.stop_condition is vf.StopCondition.USER_CLOSED and trace.errors == []
    assert [c.response_id is not None for c in trace.calls] == [True]


async def test_max_user_turns_is_a_limit_with_its_own_stop() -> None:
    class Chatty(vf.Task[vf.TaskData]):
        @vf.user
        def person(self, trace: vf.Trace) -> str:
            return f"message {len(trace.calls)}"

    trace = await vf.run_rollout(
        Chatty(vf.TaskData()),
        model="scripted:echo",
        harness="null",
        limits=Limits(max_user_turns=3),
    )
    assert trace.errors == []
    assert trace.stop_condition is vf.StopCondition.MAX_USER_TURNS
    assert trace.stop_condition.truncated
    # The opening message counts: three user messages, three segments.
    assert len(trace.segments) == 3 and trace.last_reply == "message 2"


def test_max_user_turns_is_configurable_like_the_other_limits() -> None:
    config = vf.EvalConfig.model_validate({"env": {"max_user_turns": 4}})
    assert config.env.limits().max_user_turns == 4


async def test_a_task_without_prompt_or_user_is_a_task_error_not_a_400() -> None:
    # What issue 14 reported as a 400 from the model: now refused before any call is made.
    trace = await vf.run_rollout(vf.Task(vf.TaskData()), model="scripted:echo", harness="null")
    assert trace.stop_condition is vf.StopCondition.ERROR and trace.calls == []
    assert trace.errors[0].type == "TaskError"
    assert "no prompt and its user (next_message) said nothing" in trace.errors[0].message


async def test_a_user_hook_that_raises_is_a_task_error_and_keeps_the_calls() -> None:
    class Flaky(vf.Task[vf.TaskData]):
        @vf.user
        def person(self, trace: vf.Trace) -> str:
            if trace.calls:
                raise RuntimeError("the persona file is gone")
            return "open"

    trace = await vf.run_rollout(Flaky(vf.TaskData()), model="scripted:echo", harness="null")
    assert trace.stop_condition is vf.StopCondition.ERROR
    (error,) = trace.errors
    assert error.type == "TaskError" and error.phase == "agent"
    assert error.message == "person failed: RuntimeError: the persona file is gone"
    assert len(trace.calls) == 1 and trace.last_reply == "open"  # the first segment is kept
    assert chat_loops() == []


class Customer(vf.Task[vf.TaskData]):
    customer = vf.SimulatedUser("You want a refund.\n> Hi, my mug broke.\n> A refund, please.")


async def test_a_simulated_user_speaks_through_side_calls_only() -> None:
    model = ScriptedModel("echo")
    with scripted_server(model) as url:
        trace = await vf.run_rollout(
            Customer(vf.TaskData(system_prompt="You are support.")),
            model="gpt-test",
            base_url=url,
            harness="null",
        )
    assert trace.errors == [] and trace.stop_condition is vf.StopCondition.USER_CLOSED
    assert [c.kind for c in trace.side_calls] == ["user", "user", "user"]
    assert [c.reply for c in trace.side_calls] == [
        "Hi, my mug broke.",
        "A refund, please.",
        "###DONE###",
    ]
    assert all(c.name == "customer" and c.model == "gpt-test" for c in trace.side_calls)
    assert trace.side_usage.input_tokens > 0
    # The user's second turn saw the exchange from its side: its own line as the assistant's,
    # the agent's reply as the user's; not the agent's system prompt.
    second = [(m.role, m.text) for m in trace.side_calls[1].messages]
    assert second[1:] == [("assistant", "Hi, my mug broke."), ("user", "Hi, my mug broke.")]
    assert "You want a refund." in second[0][1]
    # The agent's calls, branches and samples hold only the agent's two turns.
    assert len(trace.calls) == 2 and trace.usage.input_tokens < trace.side_usage.input_tokens
    samples = to_samples(traces_to_table([trace]))
    assert samples.num_rows == 1
    roles = [m["role"] for m in samples.column("messages").to_pylist()[0]]
    assert roles == ["system", "user", "assistant", "user", "assistant"]
    # The endpoint saw the user's calls marked as such.
    assert [r.headers.get("x-vfray-role") for r in model.history] == [
        "user",
        None,
        "user",
        None,
        "user",
    ]


async def test_side_calls_survive_the_parquet_round_trip(tmp_path: Path) -> None:
    trace = await vf.run_rollout(Customer(vf.TaskData()), model="scripted:echo", harness="null")
    write_traces([trace], tmp_path / "t.parquet")
    (back,) = table_to_traces(vf.read_traces(tmp_path / "t.parquet"))
    assert back.side_calls == trace.side_calls and back.side_usage == trace.side_usage


async def test_a_simulated_user_whose_endpoint_fails_is_a_task_error() -> None:
    model = ScriptedModel("echo")
    model.fail_next(503, times=3)  # the opening turn and both retries
    with scripted_server(model) as url:
        trace = await vf.run_rollout(
            Customer(vf.TaskData()), model="m", base_url=url, harness="null"
        )
    assert trace.stop_condition is vf.StopCondition.ERROR and trace.calls == []
    (error,) = trace.errors
    assert error.type == "TaskError"
    assert error.message.startswith("customer failed: ProviderError: user 'customer'")
    assert [c.error.type if c.error else None for c in trace.side_calls] == ["ProviderError"] * 3


def test_users_are_checked_when_the_task_type_is() -> None:
    class Two(vf.Task[vf.TaskData]):
        a = vf.SimulatedUser("x")

        @vf.user
        def b(self, trace: vf.Trace) -> None:
            return None

    class Both(vf.Task[vf.TaskData]):
        @vf.user
        def a(self, trace: vf.Trace) -> None:
            return None

        def next_message(self, trace: vf.Trace) -> None:
            return None

    class Odd(vf.Task[vf.TaskData]):
        @vf.user
        def a(self, trace: vf.Trace, runtime: Any) -> None:
            return None

    for cls, words in ((Two, "several users"), (Both, "overrides next_message"), (Odd, "runtime")):
        with pytest.raises(ConfigError, match=words):
            declared_user(cls)
        env = LocalEnvironment("scripted:echo", harness="null")
        with pytest.raises(ConfigError, match=words):
            env.spec.check_task_type(cls, 1)


def test_a_task_with_a_user_needs_a_harness_that_resumes() -> None:
    from vfray.harnesses import NullHarness
    from vfray.harnesses.registry import register_harness

    @register_harness
    class NoResume(NullHarness):
        id = "test_users_no_resume"
        SUPPORTS_RESUME = False

    env = LocalEnvironment("scripted:echo", harness="test_users_no_resume")
    with pytest.raises(IncompatibleError, match="cannot resume"):
        env.spec.check_task_type(Customer, 1)
    env.spec.check_task_type(vf.Task, 1)  # no user: fine


# -- the example, in bwrap, and on Ray --------------------------------------------------------


def support_tasks(**kwargs: Any) -> vf.Taskset[Any]:
    made = load_object(f"{EXAMPLES / 'support_dialogue.py:SupportDialogues'}")(**kwargs)
    assert isinstance(made, vf.Taskset)
    return made


def check_support(traces: list[vf.Trace]) -> None:
    assert len(traces) == 3
    for trace in traces:
        assert trace.ok, trace.errors
        assert trace.stop_condition is vf.StopCondition.USER_CLOSED
        assert trace.rewards["closed_by_customer"].value == 1.0
        kinds = [c.kind for c in trace.side_calls]
        assert kinds[-1] == "judge" and set(kinds[:-1]) == {"user"}
        assert len(trace.calls) == len(trace.segments) == len(kinds) - 2
    by_key = {t.task.key: t for t in traces}
    assert by_key["support-0"].rewards["service"].value == 1.0
    assert by_key["support-1"].rewards["service"].value == pytest.approx(1 / 3)
    assert by_key["support-1"].metrics["customer_turns"] == 3


@pytest.mark.parametrize(
    "runtime",
    ["subprocess", pytest.param("bwrap", marks=pytest.mark.skipif(not HAS_BWRAP, reason="bwrap"))],
)
async def test_support_dialogue_example(runtime: str) -> None:
    async with LocalEnvironment("scripted:echo", harness="null", runtime=runtime) as env:
        traces = await asyncio.gather(*(env.rollout(t) for t in support_tasks()))
    check_support(list(traces))
    assert chat_loops() == []


async def test_support_dialogue_with_the_user_on_another_endpoint() -> None:
    other = ScriptedModel("echo", model_name="persona")
    with scripted_server(other) as url:
        tasks = support_tasks(user_model="persona-model", user_base_url=url)
        async with LocalEnvironment("scripted:echo", harness="null") as env:
            trace = await env.rollout(next(iter(tasks)))
    assert trace.ok and trace.stop_condition is vf.StopCondition.USER_CLOSED
    users = [c for c in trace.side_calls if c.kind == "user"]
    assert len(users) == 3 and {c.model for c in users} == {"persona-model"}
    assert other.calls == 3  # the user's calls went there, the agent's and the judge's did not


@pytest.mark.usefixtures("ray_local")
@pytest.mark.parametrize("interception", ["host", "serve"])
def test_users_on_ray(tmp_path: Path, interception: str) -> None:
    config = vf.EvalConfig()
    config.farm.interception = interception  # type: ignore[assignment]
    # Bounds the exchange: a user that cannot see the calls (the serve interception records
    # them in another process) would never reach the end of its script.
    config.env.max_user_turns = 5
    with Farm(
        config=config,
        model="scripted:echo",
        harness="null",
        runtime="subprocess",
        output_dir=str(tmp_path),
        progress=False,
    ) as farm:
        result = farm.run(support_tasks())
    traces = table_to_traces(result.final_traces)
    check_support(traces)


class CopyingBroker(InProcessBroker):
    """Records into a copy of the trace, as the node's interception deployment (serve) does
    in another process: the rollout's own trace never sees the calls."""

    async def register(self, trace: vf.Trace, *args: Any) -> str:
        return await super().register(vf.Trace.model_validate_json(trace.model_dump_json()), *args)


async def test_the_user_sees_the_calls_a_broker_in_another_process_recorded() -> None:
    # Before the snapshot, the user of a serve-mode rollout saw no calls at all ([0, 0, 0]).
    task = Scripted(vf.TaskData(prompt=None), ["one", "two"])
    async with LocalEnvironment("scripted:echo", harness="null") as env:
        trace = await run_planned_rollout(
            task,
            plan=env.plan,
            harness=env.harness,
            runtime_options={},
            broker=CopyingBroker(env.interception.app),
            interception_url=env.interception.url,
        )
    assert task.seen == [0, 1, 2]
    assert trace.stop_condition is vf.StopCondition.USER_CLOSED and len(trace.calls) == 2


async def test_a_simulated_users_calls_reach_the_trace_from_a_snapshot() -> None:
    async with LocalEnvironment("scripted:echo", harness="null") as env:
        trace = await run_planned_rollout(
            Customer(vf.TaskData()),
            plan=env.plan,
            harness=env.harness,
            runtime_options={},
            broker=CopyingBroker(env.interception.app),
            interception_url=env.interception.url,
            model_target=env.interception.app.upstream.target(),
        )
    assert trace.stop_condition is vf.StopCondition.USER_CLOSED, trace.errors
    assert [c.reply for c in trace.side_calls] == [
        "Hi, my mug broke.",
        "A refund, please.",
        "###DONE###",
    ]
