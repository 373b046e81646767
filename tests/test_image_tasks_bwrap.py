"""Tasks with ``image=`` run in their image on the real bwrap runtime (issue 28): the node's
image store builds a Dockerfile FROM the offline Debian base in the tests' dockerd (the runtime's
``docker_url``), unpacks it once, and the box gets the image's root, environment, WORKDIR and
user. Pulling or building an image is the rollout's ``image`` phase, under ``timeouts.image``,
not its boot; and an image file that is not there is refused in one line before the run."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import pytest

import vfray as vf
from vfray.config import EvalConfig
from vfray.errors import ConfigError
from vfray.rollout import Timeouts
from vfray.run.environment import LocalEnvironment
from vfray.runtimes.base import Runtime
from vfray.runtimes.images import CACHE_ENV

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.skipif(
        shutil.which("bwrap") is None
        or shutil.which("skopeo") is None
        or shutil.which("umoci") is None,
        reason="bwrap, skopeo and umoci are needed",
    ),
]

PROBE = 'id -u; pwd; echo "$PATH"; echo "$GREETING"; cat /etc/task-marker'


class InItsImage(vf.Task[vf.TaskData]):
    """Rewarded when the box is the image as its config says: its user, WORKDIR, PATH and
    environment, and the file its build baked in."""

    @vf.reward
    async def in_image(self, trace: vf.Trace, runtime: Runtime) -> float:
        done = await runtime.run(["sh", "-c", PROBE], timeout=60)
        await runtime.write("written.txt", b"mine")  # the work dir is the box user's
        seen = done.stdout.split("\n")[:5]
        trace.metrics["probe"] = " | ".join(seen)
        expected = [
            "1000",
            "/srv/app",
            "/opt/tools/bin:/usr/local/bin:/usr/bin:/bin",
            "from the image",
            "baked in",
        ]
        return float(seen == expected and await runtime.read("written.txt") == b"mine")


class Built(vf.Task[vf.TaskData]):
    """Rewarded when the box has the file the image's build baked in."""

    @vf.reward
    async def built(self, runtime: Runtime) -> float:
        return float((await runtime.read("/etc/task-marker")) == b"baked in\n")


def _context(root: Path, extra: str = "", *, config: bool = True) -> Path:
    root.mkdir(parents=True)
    lines = ["FROM vfray-base:bookworm", "RUN echo 'baked in' > /etc/task-marker"]
    if config:
        lines += [
            "ENV PATH=/opt/tools/bin:/usr/local/bin:/usr/bin:/bin GREETING='from the image'",
            "WORKDIR /srv/app",
            "USER 1000:1000",
        ]
    (root / "Dockerfile").write_text("\n".join([*lines, extra]))
    return root


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "store"))
    return tmp_path / "store"


async def _rollouts(
    tasks: list[vf.Task[Any]], runtime: str, options: dict[str, Any], timeouts: Timeouts
) -> list[vf.Trace]:
    async with LocalEnvironment(
        model="scripted:echo",
        harness="null",
        runtime=runtime,
        runtime_options=options,
        timeouts=timeouts,
    ) as env:
        return list(await asyncio.gather(*(env.rollout(t) for t in tasks)))


def test_a_dockerfile_task_runs_in_its_image_on_bwrap(
    debian_in_docker: str, docker_url: str, store: Path, tmp_path: Path
) -> None:
    image = f"dockerfile:{_context(tmp_path / 'ctx')}"
    tasks: list[vf.Task[Any]] = [
        InItsImage(vf.TaskData(prompt="hi", image=image), f"t{i}") for i in range(3)
    ]
    traces = asyncio.run(_rollouts(tasks, "bwrap", {"docker_url": docker_url}, Timeouts()))
    for trace in traces:
        assert trace.errors == [], trace.errors
        assert trace.reward == 1.0, trace.metrics
        assert trace.timing["image"].end is not None  # its own phase, before boot
        assert trace.timing["image"].start <= trace.timing["boot"].start
    assert len(list((store / "rootfs").iterdir())) == 1  # unpacked once for the three


@pytest.mark.parametrize("runtime", ["bwrap", "docker"])
def test_a_build_longer_than_the_boot_deadline_is_not_a_boot_timeout(
    runtime: str, debian_in_docker: str, docker_url: str, store: Path, tmp_path: Path
) -> None:
    """The build sleeps past ``timeouts.boot``: the rollout still scores (its build is timed
    by ``timeouts.image``); with ``timeouts.image`` that short, the image phase times out."""
    options = {"docker_url": docker_url} if runtime == "bwrap" else {"base_url": docker_url}
    # The boot itself must fit its deadline: a docker box's took over 1 s with three test
    # workers on two cores, so the deadline is 4 s and the build twice that.
    slow = _context(tmp_path / "slow", "RUN sleep 8\n", config=False)
    task = Built(vf.TaskData(prompt="hi", image=f"dockerfile:{slow}"), "slow")
    short_boot = Timeouts(boot=4.0)
    (trace,) = asyncio.run(_rollouts([task], runtime, options, short_boot))
    assert trace.errors == [], trace.errors
    assert trace.reward == 1.0
    # Its own build per runtime: the engine caches a build the other runtime's run timed out
    # on (the build goes on in the engine), and the same Dockerfile would be there already.
    slower = _context(tmp_path / "slower", f"RUN echo {runtime} && sleep 4\n", config=False)
    task = Built(vf.TaskData(prompt="hi", image=f"dockerfile:{slower}"), "slower")
    (trace,) = asyncio.run(_rollouts([task], runtime, options, Timeouts(image=1.0)))
    (error,) = trace.errors
    assert (error.type, error.phase) == ("PhaseTimeoutError", "image")
    assert error.message == "image phase exceeded 1s"
    assert "boot" not in trace.timing


def test_a_missing_image_file_is_one_line_before_the_run(tmp_path: Path) -> None:
    gone = tmp_path / "nowhere" / "image.tar"
    task = InItsImage(vf.TaskData(prompt="hi", image=f"docker-archive:{gone}"), "gone")
    with (
        vf.Farm(
            "scripted:echo",
            config=EvalConfig(),
            harness="null",
            runtime="bwrap",
            backend="local",
            output_dir=str(tmp_path / "runs"),
            progress=False,
        ) as farm,
        pytest.raises(ConfigError) as caught,
    ):
        farm.run([task])
    message = str(caught.value)
    assert message == (
        f"task gone: image 'docker-archive:{gone}': no such file or directory: {gone}"
    )
    assert not list((tmp_path / "runs").rglob("*.parquet"))
