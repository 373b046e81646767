"""Shipping vfray to a cluster that does not have it, as the README and
``clusters/runtime_env.yaml`` say: a wheel built from this tree with ``pip wheel`` into
``wheels/``, submitted from the repository itself (so its ``.gitignore``, which Ray's
working_dir upload honours, applies), installed by Ray's ``pip`` runtime_env on the node. The
head runs a Python that has Ray and vfray's dependencies but no vfray (a stand-in for a cluster
image); the job runs ``vfray eval`` with no ``-o`` (its run folder must land in
``~/vfray-outputs``) and reports where its driver and a worker imported vfray from: the copy
Ray installed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from ray_head import ray_cli, ray_head

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
RUNTIME_ENV = ROOT / "clusters" / "runtime_env.yaml"


def build_wheel(dest: Path) -> Path:
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dest), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (wheel,) = dest.glob("vfray-*.whl")
    return wheel


def node_python(where: Path) -> str:
    """A virtualenv that sees this environment's packages (Ray and vfray's dependencies)
    through a ``.pth`` line, but not vfray: an editable install's finder and this worktree are
    both out of its reach, as on a cluster image without vfray."""
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", str(where)], check=True, timeout=300)
    python = where / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(purelib, "outer-site-packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    probe = subprocess.run(
        [str(python), "-c", "import ray, pydantic\ntry:\n import vfray\nexcept ImportError:\n"
         " print('no vfray')"],
        capture_output=True, text=True, env=env, cwd=where, check=False,
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr[-2000:]
    if "no vfray" not in probe.stdout:
        pytest.skip("this environment's site-packages holds vfray itself")
    return str(python)


def test_runtime_env_yaml_ships_vfray_as_a_wheel(tmp_path: Path) -> None:
    wheels = ROOT / "wheels"
    had = set(wheels.glob("*")) if wheels.exists() else None
    try:
        run_job(tmp_path, build_wheel(wheels))
    finally:  # leave the checkout as it was
        if had is None:
            shutil.rmtree(wheels, ignore_errors=True)


def run_job(tmp_path: Path, wheel: Path) -> None:
    shipped = yaml.safe_load(RUNTIME_ENV.read_text())["pip"]["packages"]
    assert any(entry.endswith(f"/wheels/{wheel.name}") for entry in shipped), (
        f"clusters/runtime_env.yaml must name the wheel `pip wheel -w wheels` builds: {wheel.name}"
    )
    home = tmp_path / "home"  # the driver's ~, where run folders go by default
    home.mkdir()
    python = node_python(tmp_path / "node")

    with ray_head(python, keep_pythonpath=False, extra_env={"HOME": str(home)}) as head:
        job = subprocess.run(
            [
                ray_cli(), "job", "submit", "--address", head.dashboard,
                "--runtime-env", str(RUNTIME_ENV), "--", "sh", "-c",
                "vfray eval arithmetic -n 4 -r 2 --harness null --no-progress"
                " && python tests/job_where.py",
            ],
            cwd=ROOT,  # the README's command, from the repository (its .gitignore applies)
            env=head.env,
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )  # fmt: skip
    logs = job.stdout + job.stderr
    assert job.returncode == 0, logs[-6000:]
    match = re.search(r"run folder: (\S+)", logs)
    assert match, logs[-6000:]
    folder = Path(match.group(1))
    assert folder.is_relative_to(home / "vfray-outputs"), folder
    rows = sum(pq.read_metadata(p).num_rows for p in Path(folder, "traces").glob("*"))
    assert rows == 8

    where = json.loads(re.findall(r"^WHERE (.*)$", logs, flags=re.MULTILINE)[-1])
    # The `vfray` command the job ran is the wheel's, installed by Ray's pip plugin (the node's
    # Python has no vfray). Submitted from the repository, the modules come from the job's
    # copy of it (the working dir is first on the path), never from this checkout.
    assert "/runtime_resources/pip/" in (where["command"] or ""), where
    for path in (where["driver"], where["worker"]["vfray"], where["worker"]["actors"]):
        assert "/runtime_resources/" in path, where
        assert not path.startswith(str(ROOT)), where
