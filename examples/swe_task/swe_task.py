"""Example taskset: a SWE-style task in its own image. The task's Dockerfile (``image/``) bakes a
git repository with a bug and a failing unittest into ``/testbed``, FROM the offline Debian base
(``python -m vfray.runtimes.debian_image``); the agent works in ``/testbed`` and the reward runs
the repository's tests inside the box, with the image's own ``python3``.

Run: ``vfray eval examples/swe_task/swe_task.py:SweTaskset --harness mini-swe-agent
--runtime docker -m scripted:agent`` (``codex``, ``claude-code``; ``--runtime bwrap``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import vfray as vf

IMAGE = f"dockerfile:{Path(__file__).resolve().parent / 'image'}"
"""Built on each node that runs the task, once per content of ``image/``. An absolute path: a
relative one is read against the current directory of the process that parses it."""

TEST_COMMAND = ("python3", "-m", "unittest", "-q", "test_stats")
"""The repository's tests, run by the image's ``python3`` (``/usr/bin/python3`` in the box):
the node's programs never touch the image's interpreter or site-packages."""

PROMPT = """\
The repository in /testbed has a failing test: `python3 -m unittest test_stats` fails because
`mean` in stats.py divides by one less than the number of values. Fix the bug, then show the diff.

run: sed -i 's/len(values) - 1/len(values)/' stats.py
run: git diff
"""
"""A real model reads the sentence; the scripted ``agent`` policy runs the ``run:`` lines."""


class SweTask(vf.Task[vf.TaskData]):
    """Solved when the repository's tests pass in the box after the agent's turn."""

    @vf.reward
    async def tests_pass(self, runtime: vf.Runtime) -> bool:
        done = await runtime.run(list(TEST_COMMAND), timeout=120)
        return done.ok

    @vf.metric
    async def files_changed(self, runtime: vf.Runtime) -> int:
        diff = await runtime.run(["git", "diff", "--name-only"], timeout=60)
        return len(diff.stdout.split()) if diff.ok else -1


def make_task() -> SweTask:
    return SweTask(vf.TaskData(prompt=PROMPT, image=IMAGE, workdir="/testbed"), key="stats-mean")


class SweTaskset(vf.Taskset[SweTask]):
    """One task: fix ``stats.mean`` so that ``test_stats`` passes."""

    name = "swe_task"

    def load(self) -> Iterator[SweTask]:
        yield make_task()
