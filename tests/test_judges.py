"""Judges: rewards computed by a model, through the rollout's endpoint by default or one of their
own, every attempt and its usage on ``trace.side_calls`` (never among the agent's calls), and a
judge that gets no usable answer recorded like any failing hook (value None + a JudgeError).
Scripted model (answering as a judge on its ``x-vfray-role: judge`` calls), null harness; the
judged-QA example also in bwrap and on Ray."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

import vfray as vf
from vfray._plugins import load_object
from vfray.errors import JudgeError
from vfray.farm import Farm
from vfray.judges import Judge, ReferenceJudge, RubricJudge
from vfray.models.scripted.server import ScriptedModel, scripted_server
from vfray.run.environment import LocalEnvironment
from vfray.traces.convert import table_to_traces

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
HAS_BWRAP = shutil.which("bwrap") is not None


class Answer(vf.TaskData):
    answer: str


class Graded(vf.Task[Answer]):
    correct = ReferenceJudge()

    @vf.reward(weight=0.0)
    def replied(self, trace: vf.Trace) -> bool:
        return bool(trace.last_reply)


async def test_a_reference_judge_is_a_reward_with_its_calls_on_the_side() -> None:
    model = ScriptedModel("arithmetic")
    with scripted_server(model) as url:
        right = await vf.run_rollout(
            Graded(Answer(prompt="What is 12 + 30?", answer="42")),
            model="m",
            base_url=url,
            harness="null",
        )
        wrong = await vf.run_rollout(
            Graded(Answer(prompt="What is 12 + 30?", answer="41")),
            model="m",
            base_url=url,
            harness="null",
        )
    assert right.ok and right.rewards["correct"].value == 1.0 and right.reward == 1.0
    assert wrong.ok and wrong.rewards["correct"].value == 0.0
    (call,) = right.side_calls
    assert (call.kind, call.name, call.model, call.reply) == ("judge", "correct", "m", "yes")
    assert call.error is None and call.usage.input_tokens > 0
    assert right.side_usage == call.usage
    prompt = call.messages[-1].text
    assert "What is 12 + 30?" in prompt and "Reference answer:\n```\n42\n```" in prompt
    assert len(right.calls) == 1  # only the agent's turn
    judged = [r for r in model.history if r.headers.get("x-vfray-role") == "judge"]
    assert len(judged) == 2


async def test_an_empty_reply_scores_zero_without_a_call() -> None:
    class Silent(Graded):
        @vf.stop
        def never(self) -> bool:
            return True  # refuses the first call: no reply at all

    trace = await vf.run_rollout(
        Silent(Answer(prompt="What is 1 + 1?", answer="2")),
        model="scripted:arithmetic",
        harness="null",
    )
    assert trace.rewards["correct"].value == 0.0 and trace.side_calls == []


async def test_a_judge_whose_answer_does_not_parse_leaves_none_and_a_judge_error() -> None:
    # The scripted judge answers yes/no; these labels are neither, and the template does not
    # ask for them: every attempt fails to parse.
    class Strict(Graded):
        correct = ReferenceJudge(
            choices=("CORRECT", "WRONG"),
            prompt="Reference answer:\n{answer}\nResponse:\n{response}\n",
            retries=2,
        )

    trace = await vf.run_rollout(
        Strict(Answer(prompt="What is 2 + 2?", answer="4")),
        model="scripted:arithmetic",
        harness="null",
    )
    record = trace.rewards["correct"]
    assert record.value is None and record.error is not None
    assert record.error.startswith("JudgeError: judge 'correct' got no usable answer in 3 attempts")
    assert "neither 'CORRECT' nor 'WRONG'" in record.error
    assert trace.rewards["replied"].value == 1.0  # the other rewards stand
    # The rollout ran to the end but its reward is incomplete: an error, not a silent None.
    assert trace.stop_condition is vf.StopCondition.COMPLETED
    assert [(e.type, e.phase) for e in trace.errors] == [("JudgeError", "scoring")]
    assert any("reward 'correct'" in note and "JudgeError" in note for note in trace.notes)
    # Every attempt was billed and is on the trace, with why it was not used.
    assert [c.reply for c in trace.side_calls] == ["yes", "yes", "yes"]
    assert {c.error.type for c in trace.side_calls if c.error} == {"ValueError"}


async def test_a_judge_whose_endpoint_is_down_is_a_judge_error(tmp_path: Path) -> None:
    class Elsewhere(Graded):
        correct = ReferenceJudge(
            endpoint=vf.ModelEndpoint(base_url="http://127.0.0.1:9/v1", model="j"), retries=0
        )

    trace = await vf.run_rollout(
        Elsewhere(Answer(prompt="What is 2 + 2?", answer="4")),
        model="scripted:arithmetic",
        harness="null",
    )
    record = trace.rewards["correct"]
    assert record.value is None and record.error is not None
    assert record.error.startswith("JudgeError: judge 'correct' got no usable answer in 1 attempt")
    assert "ProviderError" in record.error
    (call,) = trace.side_calls
    assert call.error is not None and call.error.type == "ProviderError" and call.reply is None


class Style(vf.Task[vf.TaskData]):
    tone = RubricJudge(
        [
            {"name": "polite", "description": 'says "please"', "weight": 3},
            {"name": "brief", "description": 'says "thanks"'},
        ]
    )


async def test_a_rubric_judge_asks_for_its_schema_and_weighs_the_verdicts() -> None:
    model = ScriptedModel("echo")
    with scripted_server(model) as url:
        trace = await vf.run_rollout(
            Style(vf.TaskData(prompt="Reply please")), model="m", base_url=url, harness="null"
        )
    assert trace.rewards["tone"].value == 0.75
    (judged,) = [r for r in model.history if r.headers.get("x-vfray-role") == "judge"]
    schema = judged.body["response_format"]["json_schema"]
    assert schema["name"] == "Verdicts" and "verdicts" in schema["schema"]["properties"]
    assert '- polite: says "please"' in trace.side_calls[0].messages[-1].text


async def test_a_judge_on_its_own_endpoint_and_model() -> None:
    judge_model = ScriptedModel("echo", model_name="judge")
    with scripted_server(judge_model) as judge_url:

        class Own(Graded):
            correct = ReferenceJudge(endpoint=vf.ModelEndpoint(base_url=judge_url, model="big"))

        trace = await vf.run_rollout(
            Own(Answer(prompt="What is 3 + 4?", answer="7")),
            model="scripted:arithmetic",
            harness="null",
        )
    assert trace.rewards["correct"].value == 1.0
    assert judge_model.calls == 1 and trace.side_calls[0].model == "big"


class Score(BaseModel):
    score: float


async def test_a_custom_judge_with_a_parser_plugged_from_config() -> None:
    # A plain Judge: the template, and a parser of the text; plugged by import path.
    trace = await vf.run_rollout(
        vf.Task(vf.TaskData(prompt="What is 5 + 5?")),
        model="scripted:arithmetic",
        harness="null",
        scoring_overrides={"ten": "tests.test_judges:PLUGGED"},
    )
    assert trace.rewards["ten"].value == 1.0, trace.rewards
    assert trace.side_calls[0].name == "plugged"


PLUGGED = Judge(
    'Reference answer:\n```\n10\n```\nResponse:\n```\n{response}\n```\nRespond either "good" '
    'or "bad" only.',
    parser=lambda text: {"good": 1.0, "bad": 0.0}[text.strip()],
    name="plugged",
)


async def test_a_judge_outside_a_rollout_needs_an_endpoint() -> None:
    judge: Judge[Any] = Judge("Is {response} fine?")
    with pytest.raises(JudgeError, match="ConfigError: judge 'judge' has no model endpoint"):
        await judge.evaluate(response="x")
    with pytest.raises(ValueError, match="distinct"):
        ReferenceJudge(choices=("yes", "YES"))


SCORER: Judge[Score] = Judge(
    'Criteria:\n- ok: says "8"\nResponse:\n```\n{response}\n```', schema=Score
)
"""Called from a hook, so not a Task class attribute (which would make it a reward itself)."""


async def test_a_schema_judge_called_from_a_hook() -> None:
    class Scored(vf.Task[vf.TaskData]):
        @vf.reward
        async def graded(self, trace: vf.Trace) -> float:
            try:
                answer = await SCORER.evaluate(trace=trace, response=trace.last_reply)
            except JudgeError:
                return -1.0
            return answer.parsed.score

    trace = await vf.run_rollout(
        Scored(vf.TaskData(prompt="What is 4 + 4?")), model="scripted:arithmetic", harness="null"
    )
    # The scripted judge answers verdicts, not {"score": ...}: no schema match, three attempts.
    assert trace.rewards["graded"].value == -1.0
    assert len(trace.side_calls) == 3 and trace.side_calls[0].name == "judge"
    assert all(c.error and c.error.type == "ValidationError" for c in trace.side_calls)


# -- the example ------------------------------------------------------------------------------


def qa_tasks(**kwargs: Any) -> vf.Taskset[Any]:
    made = load_object(f"{EXAMPLES / 'judged_qa.py:JudgedQA'}")(**kwargs)
    assert isinstance(made, vf.Taskset)
    return made


@pytest.mark.parametrize(
    "runtime",
    ["subprocess", pytest.param("bwrap", marks=pytest.mark.skipif(not HAS_BWRAP, reason="bwrap"))],
)
async def test_judged_qa_example(runtime: str) -> None:
    async with LocalEnvironment("scripted:arithmetic", harness="null", runtime=runtime) as env:
        traces = await asyncio.gather(*(env.rollout(t) for t in qa_tasks()))
    assert [t.rewards["correct"].value for t in traces] == [1.0] * 4
    assert all(t.ok and [c.kind for c in t.side_calls] == ["judge"] for t in traces)


async def test_judged_qa_wrong_answers_are_judged_wrong() -> None:
    async with LocalEnvironment("scripted:arithmetic?accuracy=0", harness="null") as env:
        traces = await asyncio.gather(*(env.rollout(t) for t in qa_tasks().head(2)))
    assert [t.rewards["correct"].value for t in traces] == [0.0, 0.0]


@pytest.mark.usefixtures("ray_local")
def test_judged_qa_on_ray(tmp_path: Path) -> None:
    with Farm(
        model="scripted:arithmetic",
        harness="null",
        runtime="subprocess",
        output_dir=str(tmp_path),
        progress=False,
    ) as farm:
        result = farm.run(qa_tasks())
    traces = table_to_traces(result.final_traces)
    assert sorted(t.rewards["correct"].value or 0 for t in traces) == [1.0] * 4
    assert all(t.side_calls[0].kind == "judge" and t.side_usage.input_tokens for t in traces)


def test_the_scripted_model_answers_as_user_or_judge_by_request() -> None:
    import httpx

    model = ScriptedModel("arithmetic")
    with scripted_server(model) as url:

        def ask(messages: list[dict[str, str]], **headers: str) -> httpx.Response:
            body = {"model": "m", "messages": messages}
            return httpx.post(f"{url}/chat/completions", json=body, headers=headers)

        def text(response: httpx.Response) -> str:
            assert response.status_code == 200, response.text
            return str(response.json()["choices"][0]["message"]["content"])

        persona = {"role": "system", "content": "Be brief.\n> first\n> second"}
        said = [persona, {"role": "user", "content": "go"}]
        assert text(ask(said, **{"x-vfray-role": "user"})) == "first"
        later = [
            *said,
            {"role": "assistant", "content": "first"},
            {"role": "user", "content": "ok"},
        ]
        assert text(ask(later, **{"x-vfray-role": "user"})) == "second"
        done = [
            *later,
            {"role": "assistant", "content": "second"},
            {"role": "user", "content": "k"},
        ]
        assert text(ask(done, **{"x-vfray-role": "user"})) == "###DONE###"
        grade = "Reference answer:\n```\n42\n```\nResponse:\n```\nIt is 42.\n```"
        assert text(ask([{"role": "user", "content": grade}], **{"x-vfray-role": "judge"})) == "yes"
        # No role: the server's own policy; an explicit policy header wins; a bad one is a 400.
        assert text(ask([{"role": "user", "content": "What is 2 + 3?"}])) == "5"
        echo = ask([{"role": "user", "content": "What is 2 + 3?"}], **{"x-scripted-policy": "echo"})
        assert text(echo) == "What is 2 + 3?"
        bad = ask([{"role": "user", "content": "x"}], **{"x-scripted-policy": "oracle"})
        assert bad.status_code == 400 and "x-scripted-policy" in bad.text
