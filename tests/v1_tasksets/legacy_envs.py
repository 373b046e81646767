"""Classic verifiers environments (``verifiers<0.4``'s ``SingleTurnEnv``, ``ToolEnv`` and
``MultiTurnEnv``) with local datasets, for tests/test_v1_legacy.py: vfray's legacy bridge and
verifiers' own rollout score them against the same scripted model. ``kind`` picks one."""

from __future__ import annotations

from typing import Any

import verifiers as vf
from datasets import Dataset

SYSTEM = "Answer with the number only."


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a + b


def correct(completion: Any, answer: str, parser: Any) -> float:
    """Sync, with the rubric's parser: the last reply is the answer."""
    return 1.0 if (parser.parse_answer(completion) or "").strip() == answer else 0.0


async def brevity(completion: Any) -> float:
    """Async: shorter replies score higher."""
    text = str(completion[-1].content or "") if completion else ""
    return 1.0 / (1 + len(text))


async def tool_result(completion: Any, answer: str) -> float:
    """Whether a tool message carried the answer."""
    return float(any(m.role == "tool" and str(m.content).strip() == answer for m in completion))


class FollowUp(vf.MultiTurnEnv):
    """Asks a second question after each reply: the last answer plus one."""

    async def env_response(self, messages: Any, state: Any, **kwargs: Any) -> Any:
        last = str(messages[-1].content or "").strip()
        return [{"role": "user", "content": f"What is {last} + 1?"}]


def all_correct(completion: Any, answer: str) -> float:
    replies = [str(m.content or "").strip() for m in completion if m.role == "assistant"]
    want = [answer, str(int(answer) + 1)]
    return float(replies == want)


def load_environment(kind: str = "single") -> Any:
    if kind == "single":
        rows = [("What is 2 + 3?", "5"), ("What is 7 * 6?", "42"), ("What is 10 - 4?", "7")]
        dataset = Dataset.from_list([{"question": q, "answer": a} for q, a in rows])
        parser = vf.Parser()
        rubric = vf.Rubric(funcs=[correct, brevity], weights=[1.0, 0.25], parser=parser)
        rubric.add_metric(tool_result)
        return vf.SingleTurnEnv(dataset=dataset, system_prompt=SYSTEM, parser=parser, rubric=rubric)
    if kind == "tools":
        rows = [('tool: add {"a": 2, "b": 3}', "5"), ('tool: add {"a": 20, "b": 22}', "42")]
        dataset = Dataset.from_list([{"question": q, "answer": a} for q, a in rows])
        rubric = vf.Rubric(funcs=[tool_result], weights=[2.0])
        return vf.ToolEnv(dataset=dataset, tools=[add], rubric=rubric, max_turns=4)
    if kind == "multi":
        rows = [("What is 2 + 3?", "5"), ("What is 9 - 1?", "8")]
        dataset = Dataset.from_list([{"question": q, "answer": a} for q, a in rows])
        rubric = vf.Rubric(funcs=[all_correct])
        return FollowUp(dataset=dataset, system_prompt=SYSTEM, rubric=rubric, max_turns=2)
    if kind == "group":  # a group reward function: the bridge refuses it
        dataset = Dataset.from_list([{"question": "What is 1 + 1?", "answer": "2"}])

        def best_of_group(completions: list[Any]) -> list[float]:
            return [1.0] * len(completions)

        return vf.SingleTurnEnv(dataset=dataset, rubric=vf.Rubric(funcs=[best_of_group]))
    if kind == "envgroup":  # two envs routed by row: the bridge refuses it
        envs = [load_environment("single"), load_environment("multi")]
        return vf.EnvGroup(envs=envs, env_names=["single", "multi"])
    raise ValueError(f"kind must be single, tools, multi, group or envgroup, got {kind!r}")
