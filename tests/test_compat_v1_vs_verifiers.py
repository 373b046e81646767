"""The same v1 taskset package and the same ``vf-eval`` flags, run by verifiers 0.4.0 (PyPI, in
its own virtualenv) and by ``vfray eval``, on the same scripted model: rewards, metrics and stop
conditions per task must be identical; and verifiers itself reads vfray's exported traces.

One run per side covers scoring (weighted, keyed), ``runtime.run`` / ``run_uv_script`` in
scoring, trace / request / response stops, and group-style scoring via v1's own mechanism
(``--env.id best-of-n``: ``Env.finalize`` over the siblings). Skipped when PyPI is unreachable.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from agent_tools import need_registry

from vfray.cli.main import main
from vfray.compat.v1.traces import Outcome, export_run, read_v1_traces
from vfray.provision import ToolSpec, ensure_tool
from vfray.testing.scripted import scripted_server

PACKAGES = Path(__file__).parent / "v1_tasksets"


def _uv() -> str:
    found = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
    if not os.access(found, os.X_OK):
        pytest.skip("uv is not installed (pip install uv): verifiers' harnesses need it")
    return found


def _grouped(outcomes: list[Outcome]) -> dict[str, list[tuple[Any, ...]]]:
    by_key: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
    for o in outcomes:
        by_key[o.key].append((o.rewards, o.metrics, o.stop_condition, o.reply))
    return {k: sorted(v, key=json.dumps) for k, v in by_key.items()}


@pytest.mark.slow
def test_verifiers_and_vfray_score_the_same_v1_taskset_identically(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    need_registry("pypi")
    uv_dir = tmp_path / "uvbin"
    uv_dir.mkdir()
    (uv_dir / "uv").symlink_to(_uv())
    tool = ensure_tool(
        ToolSpec(name="verifiers", kind="pypi", package="verifiers", version="0.4.0")
    )
    vf_bin = Path(tool.executable("python")).parent
    monkeypatch.setenv("VFK", "unused")
    monkeypatch.setenv("PATH", f"{uv_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.syspath_prepend(str(PACKAGES))
    with scripted_server("arithmetic") as url:
        flags = [
            "v1cmp",
            "-m",
            "scripted",
            "--client.base-url",
            url,
            "--client.api-key-var",
            "VFK",
            "--env.agent.harness.id",
            "null",
            "--env.agent.runtime.type",
            "subprocess",
            "--env.id",
            "best-of-n",
            "--env.n",
            "2",
            "--no-push",
            "--no-rich",
        ]
        env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
        env.update(
            PATH=f"{vf_bin}{os.pathsep}{uv_dir}{os.pathsep}/usr/bin:/bin", PYTHONPATH=str(PACKAGES)
        )
        done = subprocess.run(
            [str(vf_bin / "vf-eval"), *flags, "-o", str(tmp_path / "v1")],
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert main(["eval", *flags, "-o", str(tmp_path / "vfray"), "--backend", "local"]) == 0
    capsys.readouterr()
    [v1_file] = (tmp_path / "v1").glob("*/traces.jsonl")
    [run_dir] = (tmp_path / "vfray").glob("*/*")
    exported = export_run(run_dir)
    theirs, ours = _grouped(read_v1_traces(v1_file)), _grouped(read_v1_traces(exported))
    assert len(theirs) == 6 and all(len(v) == 2 for v in theirs.values())
    assert ours == theirs
    # verifiers' own model reads vfray's export, and finds the same rewards.
    read = (
        "import sys, json, verifiers.v1 as vf\n"
        "rows = [[t.task.key, t.reward, t.stop_condition] for line in open(sys.argv[1])"
        " for t in vf.WireEpisode.model_validate_json(line).traces]\n"
        "print(json.dumps(sorted(rows)))"
    )
    check = subprocess.run(
        [str(vf_bin / "python"), "-c", read, str(exported)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert check.returncode == 0, check.stderr[-2000:]
    expected = sorted([o.key, o.reward, o.stop_condition] for o in read_v1_traces(v1_file))
    assert json.loads(check.stdout) == expected
