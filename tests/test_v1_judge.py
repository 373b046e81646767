"""v1's judge on vfray: called from task code (``vf.Judge(self.config.judge).complete(...)`` and
``vf.parse_judge_choice``, interception's shape), and a package's own reference judge plugged
on its task config (wiki_search's shape: a ``ReferenceJudgeConfig`` subclass under its own id,
a ``ReferenceJudge`` subclass with its prompt). Asked at the rollout's own endpoint when the
config names none, each call kept on the trace's ``side_calls``; the scripted model plays the
judge (yes when the reference answer's words are in the response)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vfray.compat.v1 import loader
from vfray.run.environment import run_episode

PACKAGE = """
import verifiers.v1 as vf


class Config(vf.TaskConfig):
    judge: vf.JudgeConfig = vf.JudgeConfig()


class Data(vf.TaskData):
    answer: str


class Judged(vf.Task[Data, vf.State, Config]):
    @vf.reward
    async def judged(self, trace: vf.Trace) -> float:
        verdict = await vf.Judge(self.config.judge).complete(
            'Respond either "yes" or "no".\\n\\n'
            f"Response:\\n{trace.last_reply}\\n\\nReference answer:\\n{self.data.answer}",
            trace=trace,
        )
        return float(vf.parse_judge_choice(verdict.text, choices=("yes", "no")) == "yes")


class TasksConfig(vf.TasksetConfig):
    task: Config = Config()


class Tasks(vf.Taskset[Judged, TasksConfig]):
    def load(self):
        yield Judged(Data(idx=0, prompt="What is 2 + 3?", answer="5"), self.config.task)
        yield Judged(Data(idx=1, prompt="What is 2 + 4?", answer="7"), self.config.task)


__all__ = ["Tasks"]
"""


async def test_a_v1_judge_called_in_a_reward_grades_at_the_rollouts_endpoint(
    tmp_path: Path,
) -> None:
    (tmp_path / "v1judgecall").mkdir()
    (tmp_path / "v1judgecall" / "__init__.py").write_text(PACKAGE)
    right, wrong = loader.load(str(tmp_path / "v1judgecall")).load()
    rewards, judged = [], []
    for task in (right, wrong):
        episode = await run_episode(task, n=1, model="scripted:arithmetic", harness="null")
        (trace,) = episode.traces
        assert trace.ok, trace.errors
        rewards.append(trace.rewards["judged"].value)
        judged.append([(c.kind, c.name) for c in trace.side_calls])
    # 2 + 3 is answered 5 (the reference: yes), 2 + 4 is answered 6 (not 7: no).
    assert rewards == [1.0, 0.0]
    assert judged == [[("judge", "judge")]] * 2


PLUGGED = """
from pydantic import Field

import verifiers.v1 as vf


class TriviaJudgeConfig(vf.ReferenceJudgeConfig):
    id: vf.ID = "trivia-judge"
    question_field: str = "question"


class TriviaJudge(vf.ReferenceJudge):
    prompt = (
        'Question: {question}\\n\\nRespond either "{positive}" or "{negative}".\\n\\n'
        "Response:\\n{response}\\n\\nReference answer:\\n{answer}"
    )


class Config(vf.TaskConfig):
    judges: vf.Judges = Field(default_factory=lambda: [TriviaJudgeConfig()])


class Data(vf.TaskData):
    question: str
    answer: str


class Trivia(vf.Task[Data, vf.State, Config]):
    pass


class TasksConfig(vf.TasksetConfig):
    task: Config = Config()


class Tasks(vf.Taskset[Trivia, TasksConfig]):
    def load(self):
        data = Data(idx=0, prompt="What is 2 + 3?", question="two plus three", answer="5")
        yield Trivia(data, self.config.task)


__all__ = ["Tasks"]
"""


async def test_a_packages_own_reference_judge_is_plugged_with_its_prompt(tmp_path: Path) -> None:
    (tmp_path / "v1pluggedjudge").mkdir()
    (tmp_path / "v1pluggedjudge" / "__init__.py").write_text(PLUGGED)
    (task,) = loader.load(str(tmp_path / "v1pluggedjudge")).load()
    episode = await run_episode(task, n=1, model="scripted:arithmetic", harness="null")
    (trace,) = episode.traces
    assert trace.ok and trace.last_reply == "5", trace.errors
    # Its reward is named by the package's judge id, and asked with the package's prompt,
    # filled from the task's `question` field (question_field).
    assert trace.rewards["trivia-judge"].value == 1.0 and trace.reward == 1.0
    (call,) = trace.side_calls
    asked: Any = call.messages[-1].text
    assert (call.kind, call.name) == ("judge", "trivia-judge")
    assert asked.startswith('Question: two plus three\n\nRespond either "yes" or "no".')
