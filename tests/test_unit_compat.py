"""vfray.compat.v1's pure parts, one function at a time: vf-eval flags and v1 TOML tables mapped
onto vfray's config tree (and every refusal naming its option), plugged judges checked, the
v1 view of a vfray trace, hook plumbing, and the loader's one-line errors. No rollouts run here
(tests/test_compat_v1*.py run v1 tasksets end to end)."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import pytest

import vfray as vf
from vfray.compat.v1 import _hooks, _judges, loader
from vfray.compat.v1 import _trace as v1trace
from vfray.compat.v1 import config as v1config
from vfray.compat.v1._data import TaskData
from vfray.compat.v1._types import Request, Response, Reward
from vfray.errors import ConfigError
from vfray.trace import Message, RewardRecord, StopCondition, TaskRecord, Usage

# --- vf-eval flags -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tokens", "parsed"),
    [
        (["--model", "gpt-x"], {"model": "gpt-x"}),
        (
            ["-m", "gpt-x", "-n", "5", "-r", "3", "-c", "8"],
            {
                "model": "gpt-x",
                "select.limit": 5,
                "num_rollouts": 3,
                "max_concurrent": 8,
            },
        ),
        (["--num-examples", "4"], {"select.limit": 4}),
        (["--rollouts-per-example=2"], {"num_rollouts": 2}),
        (["--batch_size", "9"], {"select.limit": 9}),
        (["-s"], {"select.shuffle": True}),
        (["-s", "false"], {"select.shuffle": False}),
        (["--select.shuffle", "True"], {"select.shuffle": True}),
        (["--select.shuffle=false"], {"select.shuffle": False}),
        (["--no-rich"], {"rich": False}),
        (["--rich"], {"rich": True}),
        (["--no-push", "--clean"], {"push": False, "clean": True}),
        (["--dry-run", "-v"], {"dry_run": True, "verbose": True}),
        # A negated flag that is not one of v1's own booleans is still a boolean.
        (["--env.agent.no-thinking"], {"env.agent.thinking": False}),
        (["--env.taskset.kinds", '["a", "b"]'], {"env.taskset.kinds": ["a", "b"]}),
        (["--env.taskset.size=0.5"], {"env.taskset.size": 0.5}),
        (["--env.taskset.name", "plain"], {"env.taskset.name": "plain"}),
        # Ids and types are names, never literals: "null" is the null harness.
        (["--env.agent.harness.id", "null"], {"env.agent.harness.id": "null"}),
        (["--env.agent.runtime.type", "1"], {"env.agent.runtime.type": "1"}),
        # The last of two spellings of one option wins.
        (["-n", "5", "--num-examples", "3"], {"select.limit": 3}),
    ],
)
def test_vf_eval_flags_parse_into_v1s_dotted_names(
    tokens: list[str], parsed: dict[str, Any]
) -> None:
    assert v1config.parse_flags(tokens) == parsed


@pytest.mark.parametrize(
    ("tokens", "match"),
    [
        (["positional"], "unexpected argument 'positional'"),
        (["-x"], "unexpected argument '-x'"),
        (["--model"], "v1 option '--model' needs a value"),
        (["-n"], "v1 option '-n' needs a value"),
    ],
)
def test_malformed_flags_are_one_line_errors(tokens: list[str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        v1config.parse_flags(tokens)


@pytest.mark.parametrize(
    ("extra", "v1", "rest"),
    [
        (
            ["--backend", "local", "--num-rollouts", "2"],
            ["--num-rollouts", "2"],
            ["--backend", "local"],
        ),
        (["-s", "-v", "--env.harness.id", "bash"], ["-s", "-v"], ["--env.harness.id", "bash"]),
        (["--no-push", "--max-tokens", "5"], ["--no-push"], ["--max-tokens", "5"]),
        (["--env.taskset.k=v", "x"], ["--env.taskset.k=v"], ["x"]),
        (["--client.base-url", "http://h/v1"], ["--client.base-url", "http://h/v1"], []),
        # A boolean's explicit value stays with it (it was left over: "unexpected argument").
        (
            ["--select.shuffle", "true", "--backend", "ray"],
            ["--select.shuffle", "true"],
            [
                "--backend",
                "ray",
            ],
        ),
        (["-s", "False"], ["-s", "False"], []),
        # A boolean takes no other word: what follows is the command's own.
        (["--no-push", "pkg"], ["--no-push"], ["pkg"]),
        # A value that looks like a flag is not taken as the option's value.
        (["--env.taskset.k", "--backend", "ray"], ["--env.taskset.k"], ["--backend", "ray"]),
    ],
)
def test_leftover_tokens_split_into_v1_flags_and_the_rest(
    extra: list[str], v1: list[str], rest: list[str]
) -> None:
    assert v1config.v1_tokens(extra) == (v1, rest)


def test_a_boolean_with_its_value_survives_the_split_and_the_parse() -> None:
    flags, rest = v1config.v1_tokens(["--select.shuffle", "false", "-s", "true", "--model", "m"])
    assert rest == ["--model", "m"]  # vfray's own flag
    assert v1config.parse_flags(flags) == {"select.shuffle": True}


@pytest.mark.parametrize(
    ("token", "is_v1"),
    [
        ("--env.taskset.kinds", True),
        ("--env.agent.max-turns", True),
        ("--env.id", True),
        ("--no-rich", True),
        ("--num_rollouts", True),
        ("--group-size=2", True),
        ("--select.limit", True),
        ("-s", True),
        ("-v", True),
        ("--env.harness.id", False),  # vfray's own config key
        ("--env.max_turns", False),
        ("--backend", False),
        ("--selection", False),  # a prefix of a v1 root is not that root
        ("-n", False),
        ("select.limit", False),  # not a flag at all
    ],
)
def test_which_tokens_are_v1_flags(token: str, is_v1: bool) -> None:
    assert v1config.is_v1_token(token) is is_v1


@pytest.mark.parametrize(
    ("data", "is_v1"),
    [
        ({"env": {"taskset": {"id": "x"}}}, True),
        ({"env": {"agent": {"max_turns": 3}}}, True),
        ({"env": {"id": "best-of-n"}}, True),
        ({"num_rollouts": 2}, True),
        ({"client": {"base_url": "u"}}, True),
        ({"select": {"limit": 1}}, True),
        ({"group_size": 4}, True),
        ({"env": {"harness": {"id": "bash"}}, "taskset": "t"}, False),
        ({"env": "not-a-table"}, False),
        ({}, False),
    ],
)
def test_a_v1_toml_is_told_from_a_vfray_one(data: dict[str, Any], is_v1: bool) -> None:
    assert v1config.is_v1_toml(data) is is_v1


def test_a_nested_toml_table_flattens_to_dotted_keys_with_aliases_folded() -> None:
    tree = {
        "group-size": 3,
        "env": {"taskset": {"id": "t", "max-len": {"a": 1}}, "agent": {"max_turns": 2}},
        "num_examples": 7,
        "env_x": {"num_examples": 1},
    }
    assert v1config.flatten(tree) == {
        "num_rollouts": 3,
        "env.taskset.id": "t",
        "env.taskset.max_len.a": 1,
        "env.agent.max_turns": 2,
        "select.limit": 7,
        "env_x.num_examples": 1,  # an alias is a top-level name only
    }


# --- v1 options onto vfray's config -------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "overrides"),
    [
        (
            {"model": "m", "num_rollouts": 4, "max_concurrent": 2},
            {
                "model.name": "m",
                "rollouts_per_task": 4,
                "max_concurrent": 2,
            },
        ),
        (
            {"client.base_url": "http://h/v1", "client.api_key_var": "K"},
            {
                "model.base_url": "http://h/v1",
                "model.api_key_var": "K",
            },
        ),
        (
            {"env.agent.model": "m2", "env.agent.client.base_url": "u"},
            {
                "model.name": "m2",
                "model.base_url": "u",
            },
        ),
        (
            {"env.agent.max_turns": 5, "env.agent.max_total_tokens": 900},
            {
                "env.max_turns": 5,
                "env.max_total_tokens": 900,
            },
        ),
        (
            {"env.agent.timeout.setup": 1, "env.agent.timeout.rollout": 2},
            {
                "env.timeouts.setup": 1,
                "env.timeouts.agent": 2,
            },
        ),
        (
            {"env.agent.timeout.finalize": 3, "env.agent.timeout.scoring": 4},
            {
                "env.timeouts.finalize": 3,
                "env.timeouts.scoring": 4,
            },
        ),
        (
            {"select.limit": 3, "select.shuffle": True, "select.seed": 9},
            {
                "num_tasks": 3,
                "shuffle": True,
                "seed": 9,
            },
        ),
        (
            {"sampling.temperature": 0.2, "env.agent.sampling.top_p": 0.9},
            {
                "sampling.temperature": 0.2,
                "sampling.top_p": 0.9,
            },
        ),
        (
            {"env.agent.harness.id": "claude_code"},
            {
                "env.harness.id": "claude-code-acp",
                "taskset_args": {"harness": "claude-code-acp"},
            },
        ),
        (
            {"env.agent.harness.id": "mini-swe-agent"},
            {
                "env.harness.id": "mini-swe-agent",
                "taskset_args": {"harness": "mini-swe-agent"},
            },
        ),
        ({"env.agent.runtime.type": "docker"}, {"env.runtime.type": "docker"}),
        (
            {"env.taskset.kinds": ["a"], "env.taskset.task.rewards.x.weight": 2.0},
            {
                "taskset_args": {
                    "config": {"kinds": ["a"], "task": {"rewards": {"x": {"weight": 2.0}}}}
                },
            },
        ),
        (
            {"env.id": "user-sim", "env.user.model": "u1", "env.persona": "p"},
            {
                "taskset_args": {
                    "env": {"id": "user-sim", "user": {"model": "u1"}, "persona": "p"}
                },
            },
        ),
    ],
)
def test_v1_options_map_onto_vfray_keys(options: dict[str, Any], overrides: dict[str, Any]) -> None:
    mapped = v1config.translate(options)
    assert mapped.overrides == overrides
    # One line said per mapped option.
    for key in options:
        assert any(line.startswith(f"v1 {key} = ") for line in mapped.lines), key


def test_the_taskset_id_gets_the_v1_prefix_once() -> None:
    assert v1config.translate({"env.taskset.id": "pkg"}).overrides["taskset"] == "v1:pkg"
    assert v1config.translate({}, taskset="v1:pkg").overrides["taskset"] == "v1:pkg"
    # A TOML's own id wins over the command's positional one.
    assert v1config.translate({"env.taskset.id": "a"}, taskset="b").overrides["taskset"] == "v1:a"


def test_selection_with_include_or_exclude_keeps_v1s_order_in_one_table() -> None:
    mapped = v1config.translate(
        {
            "select.include.idx": ["1:3"],
            "select.exclude.names": ["x"],
            "select.skip": 1,
            "select.shuffle": True,
            "select.seed": 4,
            "select.limit": 2,
        }
    )
    assert mapped.overrides == {
        "taskset_args": {
            "select": {
                "include": {"idx": ["1:3"]},
                "exclude": {"names": ["x"]},
                "skip": 1,
                "shuffle": True,
                "seed": 4,
                "limit": 2,
            }
        }
    }


def test_best_of_n_is_one_group_of_n_rollouts() -> None:
    mapped = v1config.translate({"env.id": "best-of-n", "env.n": 3, "env.threshold": 0.5})
    assert mapped.overrides["rollouts_per_task"] == 3
    assert mapped.overrides["taskset_args"] == {
        "env": {"id": "best-of-n", "n": 3, "threshold": 0.5}
    }
    assert "v1 env best-of-n n=3 -> rollouts_per_task (one group)" in mapped.lines
    assert v1config.translate({"env.id": "best_of_n"}).overrides["rollouts_per_task"] == 4


def test_best_of_n_with_more_rollouts_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"num_rollouts > 1 with env\.id best-of-n"):
        v1config.translate({"env.id": "best-of-n", "num_rollouts": 2})


def test_run_flags_and_what_is_already_true_of_vfray_are_said_not_mapped() -> None:
    mapped = v1config.translate(
        {
            "dry_run": True,
            "verbose": True,
            "rich": False,
            "push": False,
            "clean": True,
            "resume": False,
            "client.type": "eval",
            "env.agent.runtime.type": "subprocess",
        }
    )
    assert (mapped.dry_run, mapped.verbose, mapped.no_progress) == (True, True, True)
    assert mapped.overrides == {"env.runtime.type": "subprocess"}
    said = "\n".join(mapped.lines)
    for note in ("live progress off", "vfray uploads nothing", "new folder", "relays the eval"):
        assert note in said
    assert "prime" not in said  # a runtime was chosen: no note about v1's default


def test_without_a_runtime_the_default_is_said() -> None:
    (line,) = v1config.translate({}).lines
    assert "default runtime (prime) is not available" in line


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"env.agent.harness.id": "opencode"}, "env.agent.harness.id=opencode (vfray harnesses"),
        ({"env.agent.runtime.type": "prime"}, "env.agent.runtime.type=prime (vfray runs"),
        ({"resume": True}, "--resume (use: vfray resume RUN_DIR"),
        ({"push": True}, "push=True"),
        ({"clean": False}, "clean=False"),
        ({"client.type": "openai"}, "client.type='openai'"),
        ({"env.timeout.setup": 3}, "env.timeout.setup=3"),
        ({"env.retries": 2}, "env.retries=2"),
        ({"env.interception.port": 1}, "env.interception.port=1"),
        ({"env.max_concurrent_agents": 2}, "env.max_concurrent_agents=2"),
        ({"env.agent.harness.version": "2"}, "env.agent.harness.version='2'"),
        ({"serve.port": 80}, "serve.port=80"),
        ({"run.name": "x"}, "run.name='x'"),
    ],
)
def test_what_vfray_cannot_honour_is_refused_naming_it(options: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError) as info:
        v1config.translate(options)
    message = str(info.value)
    assert message.startswith("v1 options not supported by vfray: ") and "\n" not in message
    assert named in message


def test_every_refused_option_is_named_in_the_same_line() -> None:
    with pytest.raises(ConfigError) as info:
        v1config.translate({"run.a": 1, "model": "ok", "run.b": 2, "env.retries": 3})
    assert str(info.value).count(";") == 2
    for name in ("run.a=1", "run.b=2", "env.retries=3"):
        assert name in str(info.value)


def test_every_v1_harness_id_names_a_built_in_vfray_harness() -> None:
    from vfray.harnesses import available_harnesses

    assert set(v1config.HARNESSES.values()) <= set(available_harnesses())
    # Every harness v1 ships (its seeds' list) but Poolside's pool agent has a vfray one.
    v1_ids = {"claude_code", "codex", "kimi_code", "openclaw", "hermes_agent", "pi"}
    v1_ids |= {"mini_swe_agent", "terminus_2", "bash", "null", "compact", "rlm", "browser_use"}
    assert v1_ids <= set(v1config.HARNESSES)
    assert set(v1config.RUNTIMES.values()) <= {"subprocess", "docker", "modal", "bwrap"}


# --- plugged judges -----------------------------------------------------------------------------


class _Config:
    def __init__(self, *judges: Any) -> None:
        self.judges = list(judges)


def test_a_reference_judge_entry_takes_v1s_defaults() -> None:
    (judge,) = _judges.plugged_judges(_Config({"id": "reference"}))
    assert judge == _judges.PluggedJudge(
        name="reference",
        weight=1.0,
        answer_field="answer",
        question_field="",
        view="last_reply",
        choices=("yes", "no"),
        endpoint=None,
    )


def test_a_reference_judge_with_its_own_model_gets_an_endpoint() -> None:
    (judge,) = _judges.plugged_judges(
        _Config(
            {
                "id": "reference",
                "name": "match",
                "weight": 2,
                "model": "judge-mini",
                "sampling": {"temperature": 0},
                "view": "transcript",
                "choices": ["same", "different"],
                "answer_field": "gold",
            }
        )
    )
    assert (judge.name, judge.weight, judge.view, judge.choices) == (
        "match",
        2.0,
        "transcript",
        ("same", "different"),
    )
    assert judge.answer_field == "gold"
    assert judge.endpoint is not None and judge.endpoint.model == "judge-mini"
    assert judge.endpoint.sampling == {"temperature": 0}


def test_no_judges_is_an_empty_list() -> None:
    assert _judges.plugged_judges(object()) == []
    assert _judges.plugged_judges(_Config()) == []


@pytest.mark.parametrize(
    ("entry", "match"),
    [
        ({"id": "rubric"}, "v1 judge 'rubric' is not supported by vfray"),
        ({"name": "x"}, r"v1 judge '\(no id\)' is not supported"),
        (
            {"id": "reference", "prompt": "p", "cache": 1},
            "options not supported by vfray: cache, prompt",
        ),
        ({"id": "reference", "view": "first_reply"}, "view 'first_reply' is not one of last_reply"),
        ({"id": "reference", "choices": ["a", "b", "c"]}, r"two labels, got \['a', 'b', 'c'\]"),
        ("reference", "is not a table of options"),
    ],
)
def test_judges_vfray_cannot_run_are_one_line(entry: Any, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        _judges.plugged_judges(_Config(entry))


# --- v1's view of a vfray trace -----------------------------------------------------------------


def _trace(**fields: Any) -> vf.Trace:
    task = TaskRecord(key="k", hash="h", data={"prompt": "p"})
    return vf.Trace(run_id="r", episode_id="e", task=task, **fields)


def _view(trace: vf.Trace) -> v1trace.Trace:
    task = v1trace.TraceTask("plain", TaskData(prompt="p"), "k", "h")
    return v1trace.Trace(trace, task)


def _played(trace: vf.Trace, finish_reason: str = "stop") -> vf.Trace:
    user = Message(role="user", content="What is 2 + 2?")
    call = {"id": "c1", "type": "function", "function": {"name": "sh", "arguments": "{}"}}
    first = Message(role="assistant", content=None, tool_calls=[call])
    result = Message(role="tool", tool_call_id="c1", content="4")
    final = Message(role="assistant", content="  It is 4.  ")
    trace.record_call(
        [user],
        first,
        usage=Usage(input_tokens=5, output_tokens=2),
        started_at=1.0,
        ended_at=2.0,
        model="m",
        finish_reason="tool_calls",
    )
    trace.record_call(
        [user, first, result],
        final,
        usage=Usage(input_tokens=9, output_tokens=3),
        started_at=3.0,
        ended_at=4.5,
        model="m",
        finish_reason=finish_reason,
    )
    return trace


@pytest.mark.parametrize(
    ("condition", "notes", "v1_name"),
    [
        (None, [], None),
        (StopCondition.COMPLETED, [], "agent_completed"),
        (StopCondition.MAX_TURNS, [], "max_turns"),
        (StopCondition.ERROR, [], "error"),
        (
            StopCondition.STOP_HOOK,
            ["other note", "stop hook 'seven_reply' ended the rollout"],
            "seven_reply",
        ),
        # The newest hook note names the stop.
        (
            StopCondition.STOP_HOOK,
            ["stop hook 'a' ended the rollout", "stop hook 'b' ended the rollout"],
            "b",
        ),
        (StopCondition.STOP_HOOK, ["no hook named"], "stop_hook"),
    ],
)
def test_stop_conditions_carry_v1s_names(
    condition: StopCondition | None, notes: list[str], v1_name: str | None
) -> None:
    trace = _trace(stop_condition=condition, notes=notes)
    assert v1trace.v1_stop_condition(trace) == v1_name
    assert _view(trace).stop_condition == v1_name
    assert _view(trace).is_completed is (condition is not None)


def test_the_view_reads_messages_replies_and_rewards_the_way_v1_hooks_do() -> None:
    trace = _played(_trace(stop_condition=StopCondition.COMPLETED, seat="solver"))
    trace.rewards = {
        "correct": RewardRecord(value=1.0, weight=0.5),
        "broken": RewardRecord(value=None),
    }
    view = _view(trace)
    assert view.vfray is trace and view.id == trace.trace_id
    assert view.agent.name == "solver"
    assert view.last_reply == "It is 4."  # stripped, as v1 gives it
    assert [m.role for m in view.assistant_messages] == ["assistant", "assistant"]
    assert [m.content for m in view.tool_messages] == ["4"]
    assert view.transcript.startswith("user: What is 2 + 2?")
    assert "tool:" not in view.transcript
    assert view.num_turns == 2
    assert view.rewards == {"correct": Reward(score=1.0, weight=0.5), "broken": None}
    assert view.reward == 0.5  # score times weight, an unscored one left out
    assert not view.is_truncated and view.ok


def test_recording_through_the_view_writes_the_vfray_trace() -> None:
    trace = _trace()
    view = _view(trace)
    view.record_reward("r", 1, weight=2)
    view.record_metric("m", 3)
    view.record_metrics({"a": 1, "b": 2.5})
    assert trace.rewards["r"] == RewardRecord(value=1.0, weight=2.0)
    assert trace.metrics == {"m": 3.0, "a": 1.0, "b": 2.5}
    assert view.agent.name == "agent"  # no seat: v1's single agent


@pytest.mark.parametrize(
    ("condition", "finish_reason", "truncated"),
    [
        (StopCondition.COMPLETED, "stop", False),
        (StopCondition.MAX_TURNS, "stop", True),
        (StopCondition.TIMEOUT, "stop", True),
        (StopCondition.COMPLETED, "length", True),  # the last reply hit the token limit
        (None, "length", True),
    ],
)
def test_truncated_is_a_budget_stop_or_a_reply_cut_at_its_length(
    condition: StopCondition | None, finish_reason: str, truncated: bool
) -> None:
    trace = _played(_trace(stop_condition=condition), finish_reason)
    assert _view(trace).is_truncated is truncated


def test_the_last_response_is_the_newest_sampled_reply() -> None:
    assert v1trace.last_response(_trace()) is None
    response = v1trace.last_response(_played(_trace()))
    assert isinstance(response, Response)
    assert (response.created, response.model, response.finish_reason) == (4, "m", "stop")
    assert response.message.content == "  It is 4.  "
    assert (response.usage.prompt_tokens, response.usage.completion_tokens) == (9, 3)  # type: ignore[union-attr]
    request = v1trace.request_of([Message(role="user", content="hi")], None)
    assert isinstance(request, Request) and request.tools is None


# --- hook plumbing ------------------------------------------------------------------------------


def test_hooks_get_what_they_ask_for_by_name_then_by_annotation() -> None:
    seen: dict[str, Any] = {}

    def hook(trace: Any, req: Request, other: int = 0) -> str:
        seen.update(trace=trace, req=req, other=other)
        return "done"

    request = Request(messages=[])
    assert _hooks.invoke(hook, {"trace": "T", Request: request, "unused": 1}) == "done"
    assert seen == {"trace": "T", "req": request, "other": 0}


def test_an_annotation_from_another_framework_matches_by_class_name() -> None:
    class Response:  # a look-alike: same name, another class
        pass

    def hook(resp: Response) -> Any:
        return resp

    real = _types_response()
    assert _hooks.invoke(hook, {type(real): real}) is real


def _types_response() -> Any:
    return Response(id="x")


@pytest.mark.parametrize(
    ("annotation", "name"),
    [("vf.Request", "Request"), ("Trace", "Trace"), (Request, "Request"), (int, "int")],
)
def test_type_names_of_resolved_and_unresolved_annotations(annotation: Any, name: str) -> None:
    assert _hooks.type_name(annotation) == name


def test_unresolvable_annotations_are_kept_as_strings() -> None:
    def hook(trace: NotImportedHere, n: int) -> bool:  # type: ignore[name-defined]  # noqa: F821
        return True

    assert _hooks.param_annotations(hook) == {"trace": "NotImportedHere", "n": "int"}

    def watches(self: Any, trace: vf_Trace) -> bool:  # type: ignore[name-defined]  # noqa: F821
        return True

    # An unresolved "vf.Trace" still chooses the boundary by its last name.
    watches.__annotations__["trace"] = "vf.Trace"
    assert _hooks.boundary(watches) == "trace"
    with pytest.raises(ConfigError, match="exactly one Request, Response, or Trace"):
        _hooks.boundary(hook)


@pytest.mark.parametrize(
    ("path", "match"),
    [
        ("nodots", "expected pkg.module.function"),
        ("json.no_such_function", "plugged function 'json.no_such_function'"),
        ("no_such_module_xyz.fn", "plugged function 'no_such_module_xyz.fn'"),
        ("json:__name__", "is not callable"),
    ],
)
def test_a_plugged_function_that_cannot_be_loaded_is_one_line(path: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        _hooks.load_function(path)


def test_plugged_functions_load_by_dots_colon_or_file(tmp_path: Path) -> None:
    import json

    (tmp_path / "scoring.py").write_text("def half(x):\n    return x / 2\n")
    assert _hooks.load_function("json.dumps") is json.dumps
    assert _hooks.load_function("json:loads") is json.loads
    assert _hooks.load_function(f"{tmp_path}/scoring.py:half")(3) == 1.5


def test_a_plugged_hook_without_a_function_or_a_method_to_override_is_refused() -> None:
    with pytest.raises(ConfigError, match="reward 'gone' plugs no fn and the task has no @reward"):
        _hooks.plugged("gone", None, "reward", None)


def test_a_plugged_hook_is_tagged_like_its_decorator_under_its_name() -> None:
    wrapped = _hooks.plugged("twice", "json.dumps", "reward", None, weight=2.0)
    assert wrapped.__name__ == "twice" and wrapped.reward is True  # type: ignore[attr-defined]
    assert wrapped([1]) == "[1]"


# --- loader -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "module"),
    [
        ("my-taskset", "my_taskset"),
        ("org/My-Taskset", "my_taskset"),
        ("org/pkg@0.2.1", "pkg"),
        ("/abs/path/to/v1cmp", "v1cmp"),
    ],
)
def test_a_taskset_spec_names_its_module(spec: str, module: str) -> None:
    assert loader.module_name(spec) == module


def test_a_spec_with_an_import_path_or_nothing_importable_is_not_a_v1_package() -> None:
    assert not loader.looks_like_v1_package("pkg.module:Taskset")
    assert not loader.looks_like_v1_package("no-such-v1-package-here")
    assert loader.is_v1("v1:x") and not loader.is_v1("x")


def test_a_missing_v1_taskset_says_what_was_tried() -> None:
    with pytest.raises(
        ConfigError, match=r"v1 taskset 'org/no-such-ts' not found \(tried to import 'no_such_ts'\)"
    ):
        loader.load("v1:org/no-such-ts")


def test_taskset_args_outside_config_select_env_harness_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"takes config, select, env, harness; got \['seed'\]"):
        loader.load_from_args("v1:x", {"config": {}, "seed": 1})


def test_a_package_that_exports_no_taskset_or_two_is_one_line(tmp_path: Path) -> None:
    none = tmp_path / "v1none_pkg"
    none.mkdir()
    (none / "__init__.py").write_text("__all__ = ['X']\nX = 1\n")
    with pytest.raises(ConfigError, match="exports no v1 Taskset subclass via __all__"):
        loader.load(str(none))
    two = tmp_path / "v1two_pkg"
    two.mkdir()
    (two / "__init__.py").write_text(
        "import verifiers.v1 as vf\n"
        "class A(vf.Taskset):\n    pass\n"
        "class B(vf.Taskset):\n    pass\n"
        "__all__ = ['A', 'B']\n"
    )
    with pytest.raises(ConfigError, match=r"exports 2 Tasksets \(A, B\); export one"):
        loader.load(str(two))


def test_a_single_file_taskset_loads_by_its_path(tmp_path: Path) -> None:
    file = tmp_path / "v1single.py"
    file.write_text(
        "import verifiers.v1 as vf\n"
        "class Sums(vf.Taskset):\n"
        "    def load(self):\n"
        "        for n in range(3):\n"
        "            yield vf.Task(vf.TaskData(prompt=f'{n} + {n}?'), self.config.task)\n"
        "__all__ = ['Sums']\n"
    )
    taskset = loader.load(str(file), select={"limit": 2})
    assert [t.data.prompt_text for t in taskset.tasks()] == ["0 + 0?", "1 + 1?"]
    assert loader.looks_like_v1_package(str(file))


def test_env_options_without_an_env_and_an_unknown_env_are_refused(tmp_path: Path) -> None:
    file = tmp_path / "v1envs.py"
    file.write_text("import verifiers.v1 as vf\nclass T(vf.Taskset):\n    pass\n__all__ = ['T']\n")
    package = loader.import_package(str(file))
    assert package is not None and package.env is None
    assert loader.build_env(package, None, {}) is None
    with pytest.raises(ConfigError, match=r"env.n, env.threshold \(no env\)"):
        loader.build_env(package, None, {"threshold": 1, "n": 2})
    with pytest.raises(ConfigError, match="v1 env 'tournament' is not supported"):
        loader.build_env(package, "tournament", {})
    with pytest.raises(ConfigError, match=r"env\.bogus \(BestOfNEnv's config has no such field\)"):
        loader.build_env(package, "best-of-n", {"bogus": 1})
    with pytest.raises(ConfigError, match=r"--env\.n: .*\(got 'many'\)"):
        loader.build_env(package, "best-of-n", {"n": "many"})


class _HubError(Exception):
    pass


_HubError.__module__ = "huggingface_hub.errors"


def test_only_errors_from_the_hub_become_the_hub_line() -> None:
    assert loader.hub_error(ValueError("bad value")) is None
    assert loader.hub_error(FileNotFoundError("local.json")) is None  # raised here, not by datasets
    line = loader.hub_error(_HubError("Repo id must be in the form 'repo_name'\nmore"))
    assert line is not None and "\n" not in line
    assert line.startswith("a Hugging Face dataset could not be loaded (_HubError: Repo id")
    try:
        try:
            raise _HubError("offline")
        except _HubError as inner:
            raise RuntimeError("loading failed") from inner
    except RuntimeError as outer:
        found = loader.hub_error(outer)
    assert found is not None and "_HubError: offline" in found  # found down the cause chain


def test_the_v1_layer_never_shadows_a_real_verifiers(monkeypatch: pytest.MonkeyPatch) -> None:
    from vfray.compat.v1 import _alias, _kinds

    real = types.ModuleType("verifiers")
    monkeypatch.setitem(sys.modules, "verifiers", real)
    _alias.install()  # the real one stays: vfray adapts its genuine objects instead
    assert sys.modules["verifiers"] is real and _kinds.genuine()
