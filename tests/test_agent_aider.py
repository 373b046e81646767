"""The ``aider`` harness: Aider from PyPI in the node's tool dir, driven by the scripted ``agent``
model (which answers in Aider's edit-block formats) through the interception, in a bwrap box and
in a docker container; a refused call ends it. Skipped with the reason when PyPI (or the box)
is not there."""

from __future__ import annotations

import json

import pytest
from agent_tools import check_ended_after_refusal, need_registry
from docker_engine import runtime_options
from test_agents import PROMPT, WriteFile, _check_solved, _timed_install

import vfray as vf
from vfray.harnesses import make_harness
from vfray.harnesses.aider import AiderConfig, AiderHarness, model_failure, model_metadata
from vfray.interception import Limits
from vfray.models.scripted import aider as policy
from vfray.models.scripted.conversation import Conversation
from vfray.rollout import Timeouts
from vfray.runtimes.base import Runtime

HARNESS = "aider"


def test_the_command_line_opts_out_of_everything_but_the_interception() -> None:
    harness = make_harness(HARNESS, {"edit_format": "diff"})
    assert isinstance(harness, AiderHarness) and isinstance(harness.config, AiderConfig)
    argv = harness.argv("aider", "do it", "m")
    assert argv[argv.index("--model") + 1] == "openai/m"
    assert argv[argv.index("--edit-format") + 1] == "diff"
    for flag in ("--no-git", "--no-auto-commits", "--analytics-disable", "--no-check-update"):
        assert flag in argv
    with_git = make_harness(HARNESS, {"git": True})
    assert isinstance(with_git, AiderHarness) and "--git" in with_git.argv("aider", "x", "m")
    entry = json.loads(model_metadata("m", 4096))["openai/m"]
    assert entry["max_input_tokens"] == 4096 and entry["input_cost_per_token"] == 0.0


def test_a_model_call_aider_gave_up_on_is_read_from_its_history() -> None:
    refused = "> litellm.AuthenticationError: AuthenticationError: OpenAIException - unknown key  "
    history = f"#### task  \n{refused}\n> Check your API key.  \n"
    assert model_failure(history) == refused[2:].strip()
    retried = f"{refused}\n> Retrying in 0.2 seconds...  \nout.txt\n> Applied edit to out.txt  \n"
    assert model_failure(retried) is None
    assert model_failure("#### task  \n> Applied edit to out.txt  \n") is None


def _conversation(system: str, user: str) -> Conversation:
    return Conversation(
        texts=(system, user), last_user=user, tool_names=frozenset(), tool_output=None,
        user_texts=(user,), system=system,
    )  # fmt: skip


def test_the_policy_answers_in_aiders_edit_formats() -> None:
    task = 'Write "hi there" to a/b.txt\nrun: ls'
    whole = _conversation("You MUST use this *file listing* format:", task)
    assert policy.is_aider(whole)
    assert policy.decide(whole).text.endswith("a/b.txt\n```\nhi there\n```\n\n```bash\nls\n```\n")
    diff = _conversation("Every *SEARCH/REPLACE block* must use this format:", task)
    assert "a/b.txt\n```\n<<<<<<< SEARCH\n=======\nhi there\n>>>>>>> REPLACE\n```" in (
        policy.decide(diff).text
    )
    assert not policy.is_aider(_conversation("You are a helpful assistant.", task))
    assert "```" not in policy.decide(_conversation(whole.system, "No filename provided")).text


class Anything(vf.Task[vf.TaskData]):
    """Any outcome scores: the stop test's task, whose file Aider never writes."""

    @vf.reward
    async def ran(self) -> bool:
        return True


async def _rollout(
    runtime: str,
    task: type[vf.Task[vf.TaskData]] = WriteFile,
    prompt: str = PROMPT,
    **options: object,
) -> vf.Trace:
    need_registry("pypi")
    _timed_install(HARNESS)
    data = vf.TaskData(prompt=prompt, workdir="/box" if runtime == "bwrap" else None)
    return await vf.run_rollout(
        task(data), model="scripted:agent", harness=HARNESS, runtime=runtime, **options
    )


def _check_aider_solved(trace: vf.Trace) -> None:
    # One call: the reply's file listing writes the file; Aider then ends.
    _check_solved(trace, calls=1)
    assert trace.calls[0].tools in (None, [])
    history = next(a for a in trace.artifacts if a.name == "aider.chat.history.md")
    assert "Applied edit to out.txt" in history.content


@pytest.mark.slow
@pytest.mark.bwrap
async def test_aider_rollout_in_bwrap() -> None:
    """The tool dir is bound read-only; the box has no network but the interception's bridge,
    so a start that reached out (litellm's model list on raw.githubusercontent.com, the update
    check, analytics) would fail or stall."""
    _check_aider_solved(await _rollout("bwrap"))


@pytest.mark.slow
@pytest.mark.docker
async def test_aider_rollout_in_docker(docker_url: str) -> None:
    _check_aider_solved(await _rollout("docker", runtime_options=runtime_options(docker_url)))


@pytest.mark.slow
@pytest.mark.bwrap
async def test_a_refused_call_ends_aider() -> None:
    """A suggested shell command is a file listing with no name to Aider's whole format, so it
    asks again; the interception refuses that second call (max_turns=1) and Aider, which retries
    a failed call with backoff, is ended within the stop grace."""
    trace = await _rollout(
        "bwrap", Anything, "run: echo hi", limits=Limits(max_turns=1), timeouts=Timeouts(agent=90)
    )
    check_ended_after_refusal(trace, HARNESS)


class WriteFileInARepo(WriteFile):
    """The task's work dir is a git repo with one commit."""

    state: list[str] = []
    """The repo after the rollout (the last one's): its commit count, then its status."""

    async def setup(self, trace: vf.Trace, runtime: Runtime) -> None:
        git = ["git", "-c", "user.name=vfray", "-c", "user.email=vfray@localhost"]
        await runtime.write("README.md", b"a repo\n")
        steps = [["git", "init", "-q"], ["git", "add", "README.md"], [*git, "commit", "-qm", "a"]]
        for argv in steps:
            done = await runtime.run(argv)
            assert done.ok, done.stderr

    @vf.metric
    async def committed(self, runtime: Runtime) -> float:
        commits = await runtime.run(["git", "rev-list", "--count", "HEAD"])
        status = await runtime.run(["git", "status", "--porcelain", "--untracked-files=all"])
        WriteFileInARepo.state = [commits.stdout.strip(), *sorted(status.stdout.splitlines())]
        return float(commits.stdout.strip()) - 1


@pytest.mark.slow
@pytest.mark.bwrap
async def test_aider_with_git_works_in_the_tasks_repo_and_commits_nothing() -> None:
    """``git: true``: Aider reads the repo (its repo map), adds the file it wrote, commits
    nothing (the scorer reads the tree as the agent left it)."""
    trace = await _rollout(
        "bwrap", WriteFileInARepo, harness_options={"git": True, "map_tokens": 1024}
    )
    _check_aider_solved(trace)
    history = next(a for a in trace.artifacts if a.name == "aider.chat.history.md").content
    assert "Git repo: .git with 1 files" in history and "Repo-map: using 1024 tokens" in history
    # Still the task's one commit; out.txt added, and Aider's own .gitignore, nothing of vfray's.
    assert trace.metrics["committed"] == 0.0
    assert WriteFileInARepo.state == ["1", "?? .gitignore", "AM out.txt"]
