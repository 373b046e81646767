"""Example taskset: short questions scored by a model. A reference-answer judge
(:class:`vfray.judges.ReferenceJudge`) decides whether the reply means the reference answer,
where an exact match would miss "The answer is 42." for "42"; its calls and tokens are kept on
``trace.side_calls`` / ``trace.side_usage``, apart from the agent's.

Run: ``vfray eval examples/judged_qa.py:JudgedQA --harness null -m scripted:arithmetic`` (the
scripted model answers the questions, and plays the judge on its calls). The judge uses the
agent's model and endpoint unless ``judge_model`` (with ``judge_base_url``,
``judge_api_key_var``) names another.
"""

from __future__ import annotations

from collections.abc import Iterator

import vfray as vf
from vfray.judges import ReferenceJudge

QUESTIONS = (
    ("What is 12 + 30?", "42"),
    ("How much is 7 times 6?", "42"),
    ("What is 100 divided by 4?", "25"),
    ("Compute 9 * 9 + 19.", "100"),
)


class Question(vf.TaskData):
    answer: str


class QATask(vf.Task[Question]):
    correct = ReferenceJudge()

    @vf.metric
    def exact_match(self, trace: vf.Trace) -> bool:
        return (trace.last_reply or "").strip() == self.data.answer


class JudgedQA(vf.Taskset[QATask]):
    name = "judged_qa"

    def __init__(
        self,
        judge_model: str | None = None,
        judge_base_url: str | None = None,
        judge_api_key_var: str | None = None,
    ) -> None:
        self.judge = vf.ModelEndpoint(
            model=judge_model, base_url=judge_base_url, api_key_var=judge_api_key_var
        )

    def load(self) -> Iterator[QATask]:
        task_type: type[QATask] = QATask
        if self.judge != vf.ModelEndpoint():
            task_type = type(
                "ConfiguredQATask",
                (QATask,),
                {
                    "correct": ReferenceJudge(endpoint=self.judge, name="correct"),
                    "__module__": __name__,
                },
            )
        for index, (question, answer) in enumerate(QUESTIONS):
            yield task_type(Question(prompt=question, answer=answer), key=f"qa-{index}")
