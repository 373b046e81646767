"""Harbor tasks on the bwrap runtime (issue 28 with issue 29's fixtures): each task's
``environment/Dockerfile`` is built FROM the offline Debian base in the tests' dockerd (the
runtime's ``docker_url``), unpacked once by the node's image store, and the box's root is that
image; the oracle solves the tasks, and a Dockerfile that fails to build is a SandboxError in
the rollout's ``image`` phase, on its own rollout only."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from vfray.run.environment import LocalEnvironment
from vfray.runtimes.images import CACHE_ENV
from vfray.tasksets.harbor_tasks import HarborTask, HarborTaskset
from vfray.trace import Trace

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.skipif(
        shutil.which("bwrap") is None
        or shutil.which("skopeo") is None
        or shutil.which("umoci") is None,
        reason="bwrap, skopeo and umoci are needed",
    ),
]

FIXTURES = Path(__file__).parent / "fixtures" / "harbor"
SOLVABLE = ("edit-file", "python-bug", "verifier-user", "multi-step", "agent-user")


def _tasks(*names: str) -> list[HarborTask]:
    return [t for t in HarborTaskset(str(FIXTURES)) if Path(t.data.task_dir).name in names]


async def _run(tasks: list[HarborTask], docker_url: str) -> dict[str, Trace]:
    async with LocalEnvironment(
        model="scripted:echo",
        harness="oracle",
        runtime="bwrap",
        runtime_options={"docker_url": docker_url},
    ) as env:
        traces = await asyncio.gather(*(env.rollout(t) for t in tasks))
    return {t.key: trace for t, trace in zip(tasks, traces, strict=True)}


def test_the_oracle_solves_harbor_tasks_in_their_images_on_bwrap(
    debian_in_docker: str, docker_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "store"))
    traces = asyncio.run(_run(_tasks(*SOLVABLE, "broken-dockerfile"), docker_url))
    for name in SOLVABLE:
        key = "vfray/multi-step" if name == "multi-step" else name
        trace = traces[key]
        assert trace.errors == [], (key, trace.errors)
        assert trace.reward == 1.0, (key, trace.rewards, trace.notes)
        assert trace.agent.runtime == "bwrap"
    (broken,) = traces["broken-dockerfile"].errors
    assert (broken.type, broken.phase) == ("SandboxError", "image")
    assert "cannot build image" in broken.message and "\n" not in broken.message
    # [agent] user: the oracle's solve.sh ran as it (the box's user is root), vfray's dir in
    # the box writable by it.
    whoami = traces["agent-user"]
    assert next(a.content for a in whoami.artifacts if a.name == "agent/whoami.txt") == "agent\n"
    edit = traces["edit-file"]  # the task's /logs/agent, kept from the image's box
    assert next(a.content for a in edit.artifacts if a.name == "agent/notes.txt") == (
        "edited greeting.txt\n"
    )
    # Between steps the box was reset as Harbor resets it: step 02's setup.sh ran as its
    # verifier checks, and its agent found no /tests of step 01's verifier.
    steps = traces["vfray/multi-step"]
    assert {k: r.value for k, r in steps.rewards.items()} == {
        "reward": 1.0, "01-create": 1.0, "02-extend": 1.0
    }  # fmt: skip
    assert next(a.content for a in steps.artifacts if a.name == "agent/step2-tests.txt") == (
        "absent\n"
    )
    # One unpacked root per image built.
    assert len(list((tmp_path / "store" / "rootfs").iterdir())) == len(SOLVABLE)
