"""vfray.judges and vfray.harnesses.users without a model call: what a judge grades, how its
prompt is filled, how answers parse into scores (JSON in prose, a schema, a rubric's verdicts, a
reference verdict's label), the refusals of bad judge and rubric settings, and a task's user
resolved from its class (one declared user, injectable parameters, the simulated user's view of
the exchange). tests/test_judges.py and tests/test_users.py run them in rollouts."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

import vfray as vf
from vfray.errors import ConfigError, JudgeError
from vfray.harnesses.users import SimulatedUser, declared_user, fill, task_fields, task_user, user
from vfray.judges.base import Judge, json_object, response_text
from vfray.judges.reference import ReferenceJudge
from vfray.judges.rubric import Criterion, RubricJudge, Verdict, Verdicts
from vfray.trace import Message, SideCall, TaskRecord, Trace


def _trace(*turns: tuple[str, str]) -> Trace:
    """A trace whose final branch is ``turns`` (role, text), recorded call by call."""
    trace = Trace(task=TaskRecord(key="k", hash="h"))
    history: list[Message] = [Message(role="system", content="be brief")]
    for role, text in turns:
        message = Message(role=role, content=text)
        if role == "assistant":
            trace.record_call(list(history), message)
        history.append(message)
    return trace


DIALOGUE = _trace(
    ("user", "Hi, my order is late."),
    ("assistant", "Sorry! What is the order number?"),
    ("user", "  "),
    ("user", "It is 42."),
    ("assistant", "  Found it: it ships today.  "),
)


# --- what a judge grades ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("view", "text"),
    [
        ("last_reply", "Found it: it ships today."),
        ("replies", "Sorry! What is the order number?\n\nFound it: it ships today."),
        (
            "transcript",
            "user: Hi, my order is late.\n\nassistant: Sorry! What is the order number?\n\n"
            "user: It is 42.\n\nassistant: Found it: it ships today.",
        ),
    ],
)
def test_each_view_shows_the_judge_its_part_of_the_exchange(view: Any, text: str) -> None:
    assert response_text(DIALOGUE, view).strip() == text


def test_a_trace_without_replies_shows_nothing() -> None:
    empty = Trace(task=TaskRecord(key="k", hash="h"))
    assert [response_text(empty, v) for v in ("last_reply", "replies", "transcript")] == [""] * 3


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ('{"score": 1}', {"score": 1}),
        (
            'Sure! ```json\n{"score": 0.5, "why": "ok"}\n``` Hope that helps.',
            {"score": 0.5, "why": "ok"},
        ),
        ('{"a": {"b": [1, 2]}} trailing', {"a": {"b": [1, 2]}}),
        ("[1, 2]", [1, 2]),  # the whole text parses: kept as it is
    ],
)
def test_the_json_object_is_found_in_the_answer(text: str, parsed: Any) -> None:
    assert json_object(text) == parsed


@pytest.mark.parametrize("text", ["no json here", "{broken: json}", ""])
def test_an_answer_without_a_json_object_raises_value_error(text: str) -> None:
    with pytest.raises(ValueError):
        json_object(text)


# --- judges: names, settings, prompts, parsing, scores ------------------------------------------


class ToneCheckJudge(Judge[str]):
    prompt = "Is {response} polite? {json: kept}"


class Graded(BaseModel):
    score: float
    reason: str = ""


class _Task(vf.Task[vf.TaskData]):
    tone = ToneCheckJudge()
    named = ToneCheckJudge(name="explicit")


def test_a_judge_is_named_by_its_attribute_its_argument_or_its_class() -> None:
    assert _Task.tone.reward_name == "tone"
    assert _Task.named.reward_name == "explicit"
    assert ToneCheckJudge().reward_name == "tone_check"
    assert Judge(prompt="x").reward_name == "judge"
    assert repr(_Task.tone) == "ToneCheckJudge(name='tone')"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"retries": -1}, "retries must be >= 0"),
        ({"view": "first_reply"}, "view must be one of last_reply, replies, transcript"),
    ],
)
def test_bad_judge_settings_are_refused(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Judge("p", **kwargs)


def test_the_prompt_is_filled_once_and_other_braces_stay() -> None:
    judge = Judge("Rate {response} for {prompt}.", system_prompt="You grade {topic}.")
    messages = judge.build_messages(response="{prompt}", prompt="the task", topic="maths")
    assert [(m.role, m.text) for m in messages] == [
        ("system", "You grade maths."),
        ("user", "Rate {prompt} for the task."),  # a value is not substituted again
    ]
    assert ToneCheckJudge().build_messages(response="hi")[0].text == "Is hi polite? {json: kept}"
    with pytest.raises(JudgeError, match="Judge has no prompt; set one"):
        Judge().build_messages()


def test_answers_parse_by_parser_then_schema_then_as_text() -> None:
    assert Judge("p").parse(" as is ") == " as is "
    assert Judge("p", parser=lambda t: len(t)).parse("four") == 4
    schema = Judge("p", schema=Graded)
    assert schema.parse('Here: {"score": 0.8}') == Graded(score=0.8)
    with pytest.raises(ValidationError):  # a ValueError: the judge asks again
        schema.parse('{"reason": "no score"}')


def test_a_schema_is_asked_for_as_the_response_format_unless_unstructured() -> None:
    fields = Judge("p", schema=Graded).request_fields()
    assert fields["response_format"]["type"] == "json_schema"
    assert fields["response_format"]["json_schema"]["name"] == "Graded"
    assert fields["response_format"]["json_schema"]["schema"]["required"] == ["score"]
    assert Judge("p", schema=Graded, structured=False).request_fields() == {}
    assert Judge("p").request_fields() == {}


@pytest.mark.parametrize(
    ("parsed", "score"),
    [
        (True, True),
        (3, 3),
        (0.25, 0.25),
        ({"a": 1.0, "b": 0.0}, {"a": 1.0, "b": 0.0}),
        (Graded(score=0.7), 0.7),
    ],
)
def test_a_parsed_answer_becomes_the_reward(parsed: Any, score: Any) -> None:
    assert Judge("p").to_score(parsed) == score


@pytest.mark.parametrize("parsed", ["yes", [1.0], None, Verdicts(verdicts=[])])
def test_an_answer_that_is_not_a_score_is_a_judge_error(parsed: Any) -> None:
    with pytest.raises(JudgeError, match=f"cannot score a {type(parsed).__name__}"):
        Judge("p", name="j").to_score(parsed)


def test_a_judges_fields_are_the_tasks_data_and_the_graded_view() -> None:
    class QA(vf.TaskData):
        answer: str
        tags: list[str] = []

    task = vf.Task(QA(prompt="2 + 2?", answer="4", tags=["maths"]))
    fields = Judge("p", view="replies").fields(task, DIALOGUE)
    assert fields["answer"] == "4" and fields["prompt"] == "2 + 2?"
    assert "tags" not in fields  # lists and tables are no template text
    assert fields["response"].startswith("Sorry!")


# --- the rubric ---------------------------------------------------------------------------------

CRITERIA = [
    Criterion(name="polite", description="says please", weight=3),
    {"name": "short", "description": "under 20 words"},
]


@pytest.mark.parametrize(
    ("criteria", "match"),
    [
        ([], "at least one criterion"),
        ([{"name": "a", "description": "x"}, {"name": "a", "description": "y"}], "unique"),
        ([{"name": "a", "description": "x", "weight": 0}], "weights sum to 0"),
    ],
)
def test_bad_rubrics_are_refused(criteria: list[Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        RubricJudge(criteria)
    with pytest.raises(ValidationError):
        Criterion(name="neg", description="x", weight=-1)


def _verdicts(**given: str) -> str:
    return Verdicts(
        verdicts=[Verdict(name=n, verdict=v, reason="r") for n, v in given.items()]
    ).model_dump_json()


def test_a_rubric_scores_the_weighted_share_of_yes() -> None:
    judge = RubricJudge(CRITERIA)
    assert judge.to_score(judge.parse(_verdicts(polite="YES ", short="no"))) == 0.75
    assert judge.to_score(judge.parse(_verdicts(polite="no", short="yes"))) == 0.25
    with pytest.raises(ValueError, match="no verdict for short"):
        judge.parse(_verdicts(polite="yes"))
    with pytest.raises(ValueError, match=r"verdicts must be yes or no, got \{'short': 'maybe'\}"):
        judge.parse(_verdicts(polite="yes", short="maybe"))
    task = vf.Task(vf.TaskData(prompt="Write a note."))
    criteria = judge.fields(task, DIALOGUE)["criteria"]
    assert criteria == "- polite: says please\n- short: under 20 words"
    prompt = judge.build_messages(**judge.fields(task, DIALOGUE))[0].text
    assert "Write a note." in prompt and '{"verdicts": [{"name": "<criterion name>"' in prompt


# --- the reference judge ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "verdict"),
    [
        ("yes", True),
        ("Yes.", True),
        ("NO", False),
        ("The answer is: no", False),
        ("no-go, but yes", True),  # "no-go" is one word, not the label
        ("yes and no", True),  # the first label said wins
    ],
)
def test_a_reference_verdict_is_the_first_label_said(text: str, verdict: bool) -> None:
    assert ReferenceJudge().parse(text) is verdict


def test_a_verdict_with_neither_label_is_asked_again_and_custom_labels_work() -> None:
    with pytest.raises(ValueError, match="the verdict is neither 'yes' nor 'no'"):
        ReferenceJudge().parse("maybe")
    judge = ReferenceJudge(choices=("CORRECT", "WRONG"))
    assert judge.parse("correct") is True and judge.parse("Wrong!") is False


@pytest.mark.parametrize("choices", [("yes", "YES"), ("", "no"), ("yes", "")])
def test_reference_labels_must_be_two_distinct_words(choices: tuple[str, str]) -> None:
    with pytest.raises(ValueError, match="two distinct, non-empty labels"):
        ReferenceJudge(choices=choices)


def test_the_reference_answer_comes_from_the_tasks_field() -> None:
    class QA(vf.TaskData):
        answer: list[str]
        gold: str = "four"

    task = vf.Task(QA(prompt="2 + 2?", answer=["4", "four"]))
    fields = ReferenceJudge().fields(task, DIALOGUE)
    assert (fields["answer"], fields["positive"], fields["negative"]) == ("4\nfour", "yes", "no")
    assert ReferenceJudge(answer_field="gold").fields(task, DIALOGUE)["answer"] == "four"
    with pytest.raises(ValueError, match="the task has no 'missing' field"):
        ReferenceJudge(answer_field="missing").fields(task, DIALOGUE)


async def test_an_empty_reply_scores_zero_without_asking() -> None:
    class QA(vf.TaskData):
        answer: str

    silent = _trace(("user", "2 + 2?"), ("assistant", "   "))
    task = vf.Task(QA(prompt="2 + 2?", answer="4"))
    # No endpoint is configured: a call would fail, so 0.0 proves none was made.
    assert await ReferenceJudge().score(task, silent) == 0.0
    assert silent.side_calls == []


# --- users --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("template", "fields", "filled"),
    [
        ("Hi {name}", {"name": "Ada"}, "Hi Ada"),
        ("{a}{b}", {"a": "{b}", "b": "x"}, "{b}x"),  # one pass
        ('{"json": {name}}', {"name": 1}, '{"json": 1}'),
        ("{unknown} stays", {"name": "Ada"}, "{unknown} stays"),
        ("no fields {x}", {}, "no fields {x}"),
        ("{a.b}", {"a.b": "dotted"}, "dotted"),  # names are matched literally
    ],
)
def test_templates_fill_only_the_given_names(
    template: str, fields: dict[str, Any], filled: str
) -> None:
    assert fill(template, fields) == filled


def test_a_tasks_fields_are_its_scalar_data_and_the_prompt_as_text() -> None:
    class Persona(vf.TaskData):
        mood: str
        budget: int
        history: dict[str, str] = {}

    task = vf.Task(Persona(prompt=[{"role": "user", "content": "hello"}], mood="cross", budget=3))
    fields = task_fields(task)
    assert (fields["mood"], fields["budget"], fields["prompt"]) == ("cross", 3, "hello")
    assert "history" not in fields and "network_allow" not in fields


def test_a_simulated_user_sees_the_exchange_from_its_side() -> None:
    customer = SimulatedUser("You are a {mood} customer.", name="customer")
    trace = _trace(
        ("user", "My order is late."),
        ("assistant", "Sorry!"),
        ("assistant", "What is the number?"),
    )
    trace.side_calls.append(SideCall(kind="user", name="customer", reply="My order is late."))
    trace.side_calls.append(SideCall(kind="user", name="someone-else", reply="Sorry!"))

    class Persona(vf.TaskData):
        mood: str

    task = vf.Task(Persona(prompt=None, mood="cross"))
    messages = customer.conversation(trace, task)
    assert [(m.role, m.text) for m in messages] == [
        ("system", "You are a cross customer."),
        ("assistant", "My order is late."),  # its own line
        ("user", "Sorry!\n\nWhat is the number?"),  # the agent's replies, joined
    ]
    # Nothing said yet, or its own line last: it is asked to open (or go on).
    fresh = customer.conversation(Trace(task=TaskRecord(key="k", hash="h")), task)
    assert [m.role for m in fresh] == ["system", "user"] and fresh[1].text == customer.opening
    with pytest.raises(ValueError, match="retries must be >= 0"):
        SimulatedUser("x", retries=-1)


def test_a_simulated_user_is_named_by_its_attribute() -> None:
    class Support(vf.Task[vf.TaskData]):
        caller = SimulatedUser("You call support.")

    assert (
        Support.caller.name == "caller" and repr(Support.caller) == "SimulatedUser(name='caller')"
    )
    assert declared_user(Support) == ("caller", Support.caller)
    resolved = task_user(Support(vf.TaskData(prompt=None)))
    assert (resolved.name, resolved.declared) == ("caller", True)


def test_a_task_declares_at_most_one_user_it_can_call() -> None:
    class Two(vf.Task[vf.TaskData]):
        @user
        def a(self, trace: Trace) -> str | None:
            return None

        b = SimulatedUser("x")

    class Both(vf.Task[vf.TaskData]):
        @user
        def a(self, trace: Trace) -> str | None:
            return None

        def next_message(self, trace: Trace) -> str | None:
            return None

    class Odd(vf.Task[vf.TaskData]):
        @user
        def a(self, trace: Trace, mood: str) -> str | None:
            return None

    with pytest.raises(ConfigError, match="declares several users: a, b"):
        declared_user(Two)
    with pytest.raises(ConfigError, match="declares the user 'a' and overrides next_message"):
        declared_user(Both)
    with pytest.raises(ConfigError, match="parameter 'mood' cannot be injected"):
        declared_user(Odd)
    with pytest.raises(TypeError, match="decorates a method"):
        user(42)  # type: ignore[type-var]


def test_an_override_without_the_decorator_is_no_longer_a_user() -> None:
    class Base(vf.Task[vf.TaskData]):
        @user
        def talk(self, trace: Trace) -> str | None:
            return "hi"

    class Quiet(Base):
        def talk(self, trace: Trace) -> str | None:  # type: ignore[override]
            return None

    assert declared_user(Base) is not None and declared_user(Quiet) is None
    assert (task_user(Quiet(vf.TaskData(prompt="p"))).name, declared_user(Quiet)) == (
        "next_message",
        None,
    )


async def test_a_user_method_gets_trace_and_task_by_name() -> None:
    class Echo(vf.Task[vf.TaskData]):
        @user
        def talk(self, task: vf.Task[Any], trace: Trace) -> str:
            return f"{task.data.prompt}:{len(trace.calls)}"

    class AsyncEcho(vf.Task[vf.TaskData]):
        @user
        async def talk(self, trace: Trace) -> str:
            return f"async:{len(trace.calls)}"

    trace = _trace(("user", "q"), ("assistant", "a"))
    assert await task_user(Echo(vf.TaskData(prompt="p"))).ask(trace) == "p:1"
    assert await task_user(AsyncEcho(vf.TaskData(prompt="p"))).ask(trace) == "async:1"
    default = task_user(vf.Task(vf.TaskData(prompt="p")))
    assert (default.name, default.declared) == ("next_message", False)
    assert await default.ask(trace) is None
