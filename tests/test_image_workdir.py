"""A task that names no ``workdir`` works in its image's ``WORKDIR``, as ``docker run`` starts
there (issue 28): the agent's commands and the scoring hooks' runs, reads and writes, on docker,
podman and bwrap over an image. The image is the offline Debian base with only its config's
working dir changed (``umoci config`` on a copy of its OCI layout; the dir is not in the root)."""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Any

import pytest

import vfray as vf
from vfray.runtimes.base import Runtime

WORKDIR = "/srv/app"


@pytest.fixture(scope="module")
def workdir_image(debian_image: object, tmp_path_factory: pytest.TempPathFactory) -> str:
    """``oci:`` reference of the base image with ``WORKDIR /srv/app``."""
    from vfray.runtimes.debian_image import DebianImage

    assert isinstance(debian_image, DebianImage)
    layout = tmp_path_factory.mktemp("workdir-image") / "oci"
    layout.mkdir()
    for name in ("oci-layout", "index.json"):
        shutil.copy(debian_image.layout / name, layout / name)
    # The blobs are content-addressed and only ever added to: links, not a 100 MB copy.
    shutil.copytree(debian_image.layout / "blobs", layout / "blobs", copy_function=os.link)
    subprocess.run(
        # No history entry (its timestamp): the same index every run, so the node's image
        # store unpacks it once per machine, not once per run.
        ["umoci", "config", "--image", f"{layout}:{debian_image.tag}", "--tag", "workdir",
         "--no-history", f"--config.workingdir={WORKDIR}"],
        check=True, capture_output=True,
    )  # fmt: skip
    return f"oci:{layout}:workdir"


@pytest.fixture(params=["bwrap", "docker", "podman"])
def runtime(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    name = str(request.param)
    if name == "bwrap":
        if shutil.which("bwrap") is None:
            pytest.skip("needs bubblewrap")
        return name, {}
    if name == "docker":
        return name, {"base_url": request.getfixturevalue("docker_url")}
    from vfray.runtimes.podman import PodmanRuntime

    if shutil.which("podman") is None:
        pytest.skip("podman is not installed (apt-get install podman)")
    try:
        PodmanRuntime.preflight({})
    except vf.ConfigError as exc:
        pytest.skip(str(exc))
    return name, {}


class InItsWorkdir(vf.Task[vf.TaskData]):
    """Rewarded when the agent's ``pwd`` and the hooks' runs and relative paths are WORKDIR."""

    @vf.reward
    async def in_workdir(self, trace: vf.Trace, runtime: Runtime) -> float:
        here = await runtime.run(["pwd"], timeout=60)
        await runtime.write("marker.txt", b"written here")
        seen = await runtime.run(["cat", f"{WORKDIR}/marker.txt"], timeout=60)
        trace.metrics["seen"] = f"{here.stdout.strip()} | {seen.stdout} | {trace.last_reply}"
        return float(
            here.stdout.strip() == WORKDIR
            and seen.stdout == "written here"
            and WORKDIR in (trace.last_reply or "")
        )


@pytest.mark.docker
@pytest.mark.bwrap
async def test_a_task_with_no_workdir_works_in_its_images_workdir(
    runtime: tuple[str, dict[str, Any]], workdir_image: str
) -> None:
    name, options = runtime
    task = InItsWorkdir(
        vf.TaskData(prompt="Run `pwd` and report what it prints.", image=workdir_image)
    )
    trace = await vf.run_rollout(
        task, model="scripted:bash", harness="bash", runtime=name, runtime_options=options
    )
    assert trace.ok, trace.errors
    assert trace.reward == 1.0, trace.metrics
