"""v1's judge called from task code (``vf.Judge(self.config.judge).complete(...)`` and
``vf.parse_judge_choice``, interception's shape) on vfray: asked at the rollout's own endpoint
when the config names none, its call kept on the trace's ``side_calls``; the scripted model
plays the judge (yes when the reference answer's words are in the response)."""

from __future__ import annotations

from pathlib import Path

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
