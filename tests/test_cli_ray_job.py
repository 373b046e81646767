"""``ray job submit -- vfray eval …`` without ``-o``: the job's working dir is Ray's temporary
copy, so run folders go to ``~/vfray-outputs`` (a durable place) and the printed path is
absolute and still there after the job ended. Uses the real Ray head of ``test_ray_job``."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.test_ray_job import ray_cli, ray_env, ray_head

pytestmark = pytest.mark.slow
__all__ = ["ray_head"]  # the fixture, imported so pytest finds it here


def test_a_ray_job_without_o_writes_to_a_durable_folder(ray_head: str, tmp_path: Path) -> None:
    working_dir = tmp_path / "project"
    working_dir.mkdir()
    (working_dir / "README.txt").write_text("uploaded by ray job submit\n")
    home = tmp_path / "home"
    runtime_env = json.dumps({"env_vars": {"HOME": str(home)}})
    job = subprocess.run(
        [
            ray_cli(), "job", "submit", "--address", ray_head, "--working-dir", str(working_dir),
            "--runtime-env-json", runtime_env,
            "--", "vfray", "eval", "arithmetic", "-n", "3", "-r", "2", "--harness", "null",
            "--no-progress",
        ],
        env=ray_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )  # fmt: skip
    logs = job.stdout + job.stderr
    assert job.returncode == 0, logs[-5000:]
    assert "temporary working-dir copy" in logs, logs[-5000:]
    match = re.search(r"run folder: (\S+)", logs)
    assert match, logs[-5000:]
    run_dir = Path(match.group(1))
    assert run_dir.is_absolute()
    assert run_dir.is_relative_to(home / "vfray-outputs")
    assert (run_dir / "config.json").exists() and (run_dir / "eval.log").exists()
