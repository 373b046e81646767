# mypy: ignore-errors
"""A two-agent env as v1's docs show: ``Relay.run`` has the solver answer the task, then hands
its answer to the checker (a plain task with its own system prompt) in a two-turn interaction;
``finalize`` judges across both traces. Seats are the env config's ``AgentConfig`` fields."""

from __future__ import annotations

import verifiers.v1 as vf

ROWS = [(2, 3), (4, 4)]


class SumData(vf.TaskData):
    a: int
    b: int


class SumTask(vf.Task[SumData]):
    @vf.reward
    async def correct(self, trace: vf.Trace) -> float:
        return float(trace.last_reply == str(self.data.a + self.data.b))


class Sums(vf.Taskset):
    def load(self):
        for a, b in ROWS:
            yield SumTask(SumData(prompt=f"What is {a} + {b}?", a=a, b=b), self.config.task)


class RelayConfig(vf.EnvConfig):
    solver: vf.AgentConfig = vf.AgentConfig()
    checker: vf.AgentConfig = vf.AgentConfig()
    bonus: int = 1


class Relay(vf.Env[RelayConfig]):
    async def run(self, task, agents):
        solved = await agents.solver.run(task)
        checker_task = vf.Task(vf.TaskData(prompt=None, system_prompt="You check sums."))
        async with agents.checker.interaction(checker_task) as checker:
            first = await checker.turn(f"What is {solved.last_reply} + {self.config.bonus}?")
            await checker.turn(f"What is {first.last_reply} + {self.config.bonus}?")

    async def finalize(self, task, episode):
        by_name = {t.agent.name: t for t in episode.traces}
        solver, checker = by_name["solver"], by_name["checker"]
        expected = task.data.a + task.data.b + 2 * self.config.bonus
        for trace in episode.traces:
            trace.record_metric("seats", float(len(episode.traces)))
            trace.record_reward("chain", float(checker.last_reply == str(expected)), 0.5)
        solver.record_metric("checker_turns", float(checker.num_turns))
