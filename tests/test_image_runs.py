"""Image tasks in whole runs: a task in its own image (built FROM the offline base image) runs
there on docker while a task whose Dockerfile fails gets a SandboxError on each of its rollouts
only; an image task on the subprocess runtime is refused before anything runs, in one line
naming the runtimes that can run it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import vfray as vf
from vfray.config import EvalConfig
from vfray.errors import ConfigError, IncompatibleError, SandboxError
from vfray.runtimes.base import Runtime, RuntimeSpec
from vfray.runtimes.images import CACHE_ENV
from vfray.runtimes.subprocess import SubprocessRuntime


class InImage(vf.Task[vf.TaskData]):
    """Rewarded when its box is its image: the baked-in file, read from the work dir."""

    @vf.reward
    async def in_image(self, trace: vf.Trace, runtime: Runtime) -> float:
        here = await runtime.run(["sh", "-c", "pwd; cat marker"])
        return float(here.stdout == "/testbed\nbaked in\n")


def _context(root: Path, run: str) -> Path:
    root.mkdir(parents=True)
    (root / "Dockerfile").write_text(
        f"FROM vfray-base:bookworm\nRUN mkdir /testbed && echo 'baked in' > /testbed/marker\n{run}"
    )
    return root


def test_a_failed_build_fails_only_that_tasks_rollouts(
    debian_in_docker: str,
    docker_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "store"))
    good = _context(tmp_path / "good", "")
    bad = _context(tmp_path / "bad", "RUN echo broken >&2; exit 7\n")
    tasks = [
        InImage(vf.TaskData(prompt="hi", image=f"dockerfile:{good}", workdir="/testbed"), "good"),
        InImage(vf.TaskData(prompt="hi", image=f"dockerfile:{bad}", workdir="/testbed"), "bad"),
    ]
    config = EvalConfig()
    config.env.runtime.options = {"base_url": docker_url}
    with vf.Farm(
        "scripted:echo",
        config=config,
        harness="null",
        runtime="docker",
        backend="local",
        max_retries=0,
        output_dir=str(tmp_path / "runs"),
        progress=False,
    ) as farm:
        result = farm.run(tasks, rollouts_per_task=2)
    rows = result.final_traces.to_pylist()
    by_task: dict[str, list[dict[str, object]]] = {}
    for row in rows:
        by_task.setdefault(str(row["task_key"]), []).append(row)
    assert [r["reward"] for r in by_task["good"]] == [1.0, 1.0]
    assert [r["error_type"] for r in by_task["good"]] == [None, None]
    for row in by_task["bad"]:
        assert row["error_type"] == "SandboxError"
        message = str(row["error_message"])
        assert message.startswith(f"cannot build image 'dockerfile:{bad}/Dockerfile")
        assert "returned a non-zero code: 7" in message and "\n" not in message


def test_an_image_task_on_subprocess_is_refused_before_anything_runs(tmp_path: Path) -> None:
    task = InImage(vf.TaskData(prompt="hi", image="debian:bookworm"))
    with (
        vf.Farm(
            "scripted:echo",
            harness="null",
            runtime="subprocess",
            backend="local",
            output_dir=str(tmp_path),
            progress=False,
        ) as farm,
        pytest.raises(IncompatibleError) as caught,
    ):
        farm.run([task])
    message = str(caught.value)
    assert "runtime 'subprocess' cannot run images" in message
    assert "'docker'" in message and "'modal'" in message and "\n" not in message
    assert not list(tmp_path.rglob("*.parquet"))


def test_a_malformed_image_is_one_line_before_the_run(tmp_path: Path) -> None:
    task = InImage(vf.TaskData(prompt="hi", image="Not A/Reference"))
    with (
        vf.Farm(
            "scripted:echo",
            harness="null",
            runtime="subprocess",
            backend="local",
            output_dir=str(tmp_path),
            progress=False,
        ) as farm,
        pytest.raises(ConfigError, match=r"is not a valid image reference") as caught,
    ):
        farm.run([task])
    assert "\n" not in str(caught.value)


def test_the_subprocess_box_itself_refuses_an_image() -> None:
    box = SubprocessRuntime(RuntimeSpec(image="debian:bookworm"))
    with pytest.raises(SandboxError, match=r"cannot run images; use a runtime"):
        asyncio.run(box.start())
    asyncio.run(box.stop())


IMAGE_TASKS = """
import vfray as vf


class InImage(vf.Task[vf.TaskData]):
    @vf.reward
    def ok(self, trace: vf.Trace) -> bool:
        return True


class Images(vf.Taskset[InImage]):
    def load(self):
        return [InImage(vf.TaskData(prompt="hi", image="debian:bookworm"))]
"""


def test_the_cli_refuses_an_image_task_before_the_run_starts(tmp_path: Path) -> None:
    from tests.test_cli_first_hour import LOCAL, one_error_line, vfray

    (tmp_path / "images.py").write_text(IMAGE_TASKS)
    out = tmp_path / "out"
    proc = vfray(
        "eval", "images.py:Images", *LOCAL, "--runtime", "subprocess", "-o", str(out),
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode != 0
    one_error_line(proc, "runtime 'subprocess' cannot run images", "'docker'", "'modal'")
    assert not out.exists()  # no run folder, no eval.log: refused before the run


def test_an_image_kind_the_runtime_cannot_take_is_refused_before_the_run(tmp_path: Path) -> None:
    # Modal has no builder for image files: refused once on the driver, not on each rollout.
    from vfray.config import load_config
    from vfray.run.spec import resolve_run

    layout = tmp_path / "layout"
    layout.mkdir()
    spec = resolve_run(
        load_config(overrides={"model.name": "scripted:echo", "env.runtime.type": "modal"})
    )
    spec.check_task(InImage(vf.TaskData(prompt="hi", image="debian:bookworm")))  # a registry: fine
    with pytest.raises(ConfigError) as caught:
        spec.check_task(InImage(vf.TaskData(prompt="hi", image=f"oci:{layout}")))
    assert "no builder for oci: images" in str(caught.value) and "\n" not in str(caught.value)
