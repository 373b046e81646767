"""vfray's own files in a box's work dir (``.vfray``: programs, transcripts, agent homes) stay out
of a git repo the task set up there: an agent's ``git add -A`` (how mini-swe-agent's SWE-bench
config builds the patch it submits) stages only its own work, and ``git status`` shows only that.
Real boxes (subprocess, bwrap, docker) and vfray's ``bash`` loop driven by the scripted model."""

from __future__ import annotations

import shutil

import pytest
from docker_engine import box_options

import vfray as vf
from vfray.runtimes.base import Runtime

GIT = ("git", "-c", "user.name=vfray", "-c", "user.email=vfray@localhost")


class InARepo(vf.Task[vf.TaskData]):
    """A repo with one commit; the agent writes a file and stages everything."""

    async def setup(self, trace: vf.Trace, runtime: Runtime) -> None:
        await runtime.write("README.md", b"a repo\n")
        for argv in (
            ("git", "init", "-q"),
            ("git", "add", "README.md"),
            (*GIT, "commit", "-qm", "a"),
        ):
            done = await runtime.run(list(argv))
            assert done.ok, done.stderr

    @vf.reward
    async def staged_only_its_work(self, runtime: Runtime) -> bool:
        staged = await runtime.run(["git", "diff", "--cached", "--name-only"])
        return staged.stdout.split() == ["out.txt"]

    @vf.metric
    async def status_clean_of_vfray(self, runtime: Runtime) -> bool:
        status = await runtime.run(["git", "status", "--porcelain", "--untracked-files=all"])
        return ".vfray" not in status.stdout and "out.txt" in status.stdout


RUNTIMES = [
    "subprocess",
    pytest.param(
        "bwrap", marks=pytest.mark.skipif(shutil.which("bwrap") is None, reason="no bwrap")
    ),
    "docker",
]


@pytest.mark.skipif(shutil.which("git") is None, reason="no git on this machine")
@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_an_agents_git_add_all_stages_none_of_vfrays_files(
    runtime: str, request: pytest.FixtureRequest
) -> None:
    options = box_options(runtime, request)
    data = vf.TaskData(prompt="run: `echo hi > out.txt && git add -A`", workdir="/box")
    trace = await vf.run_rollout(
        InARepo(data),
        model="scripted:bash",
        harness="bash",
        runtime=runtime,
        runtime_options=options,
    )
    assert trace.errors == [], trace.errors
    assert trace.rewards["staged_only_its_work"].value == 1.0
    assert trace.metrics["status_clean_of_vfray"] == 1.0
