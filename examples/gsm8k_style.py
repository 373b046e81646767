"""Example taskset: gsm8k-style word problems with numeric answers. The reward writes the reply
into the box and runs a PEP 723 checker script there with ``runtime.run_uv_script``, so a
scorer's dependencies (none here, so it also works offline) never touch the farm process.

Run: ``vfray eval examples/gsm8k_style.py:Gsm8kStyleTaskset --harness null
-m scripted:arithmetic``. ``uv`` must be on the box's PATH (``pip install uv``); without it the
reward has no value and the trace says why.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import vfray as vf
from vfray.runtimes.base import ProgramResult

PROBLEMS = (
    (
        "Natalia sold clips to 48 of her friends in April, and then she sold half as many "
        "clips in May. How many clips did Natalia sell altogether in April and May?",
        "48 plus 48 divided by 2",
        72,
    ),
    (
        "Weng earns 12 dollars an hour for babysitting. Yesterday she babysat for 50 minutes. "
        "How many dollars did she earn?",
        "12 times 50 divided by 60",
        10,
    ),
    (
        "Betty needs 100 dollars for a new wallet and has half of it. Her parents give her 15 "
        "dollars and her grandparents twice as much as her parents. How much more does she need?",
        "100 minus 100 divided by 2 minus 15 minus 15 times 2",
        5,
    ),
    (
        "James writes a 3-page letter to 2 different friends twice a week. How many pages does "
        "he write in a year of 52 weeks?",
        "3 times 2 times 2 times 52",
        624,
    ),
    (
        "A robe takes 2 bolts of blue fiber and half that much white fiber. How many bolts does "
        "it take in total?",
        "2 plus 2 divided by 2",
        3,
    ),
)
"""(question, the worked computation in words, answer)."""

CHECKER = """\
# /// script
# requires-python = ">=3.9"
# dependencies = []
# ///
# Prints {"correct": bool, "parsed": float | null}: is the last number in the reply the answer?
import json, re, sys

reply = open(sys.argv[1], encoding="utf-8").read()
expected = float(sys.argv[2])
numbers = re.findall(r"-?\\d[\\d,]*(?:\\.\\d+)?", reply)
parsed = float(numbers[-1].replace(",", "")) if numbers else None
print(json.dumps({"correct": parsed is not None and abs(parsed - expected) < 1e-6,
                  "parsed": parsed}))
"""
"""The checker run inside the box; a real one would list its dependencies (sympy, ...)."""

REPLY_PATH = ".vfray/gsm8k/reply.txt"


class ProblemData(vf.TaskData):
    question: str
    answer: int


class CheckerError(vf.TaskError):
    """The checker script produced no verdict (uv missing, script crashed)."""


def _verdict(result: ProgramResult) -> dict[str, object]:
    for line in reversed(result.stdout.strip().splitlines()):
        try:
            found = json.loads(line)
        except ValueError:
            continue
        if isinstance(found, dict) and "correct" in found:
            return found
    tail = (result.stderr.strip() or result.stdout.strip())[-500:]
    # 127 is "command not found" (subprocess, docker); bwrap reports a failed execvp instead.
    if result.exit_code == 127 or ("execvp uv" in tail and "No such file" in tail):
        raise CheckerError(f"uv is not installed in the box (pip install uv): {tail}")
    how = "timed out" if result.timed_out else f"exit code {result.exit_code}"
    raise CheckerError(f"the checker script gave no verdict ({how}): {tail}")


class ProblemTask(vf.Task[ProblemData]):
    @vf.reward
    async def correct(self, trace: vf.Trace, runtime: vf.Runtime) -> bool:
        await runtime.write(REPLY_PATH, (trace.last_reply or "").encode())
        result = await runtime.run_uv_script(
            CHECKER, [REPLY_PATH, str(self.data.answer)], timeout=120
        )
        return _verdict(result)["correct"] is True

    @vf.metric
    def reply_chars(self, trace: vf.Trace) -> int:
        return len(trace.last_reply or "")


def make_task(index: int, question: str, computation: str, answer: int, hint: bool) -> ProblemTask:
    # The computation in words lets the offline scripted ``arithmetic`` model solve the problem;
    # drop it (hint=False) to evaluate a real model on the bare question.
    prompt = question + (f"\nWork it out as {computation}." if hint else "")
    prompt += "\nEnd your reply with the final number."
    data = ProblemData(prompt=prompt, question=question, answer=answer)
    return ProblemTask(data, key=f"gsm8k-style-{index}")


class Gsm8kStyleTaskset(vf.Taskset[ProblemTask]):
    """The built-in :data:`PROBLEMS`; ``hint=False`` leaves out the worked computation."""

    name = "gsm8k_style"

    def __init__(self, hint: bool = True) -> None:
        self.hint = hint

    def load(self) -> Iterator[ProblemTask]:
        for index, (question, computation, answer) in enumerate(PROBLEMS):
            yield make_task(index, question, computation, answer, self.hint)
