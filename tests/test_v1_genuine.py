"""vfray installed next to verifiers 0.4.0 and its example environments (one virtualenv, as a
verifiers user has it: .ci/run builds it and names it in ``VFRAY_V1_VENV``): vfray runs the
genuine verifiers objects, and scores them as verifiers does, on the same scripted model, with
the hub dataset replaced by the same small local one on both sides. Skipped without that venv.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
SIDE = ROOT / "benchmarks" / "vs_verifiers" / "genuine_side.py"


def _venv() -> Path:
    where = os.environ.get("VFRAY_V1_VENV")
    if not where or not (Path(where) / "bin" / "vf-eval").exists():
        pytest.skip("no virtualenv with vfray and verifiers 0.4.0 (VFRAY_V1_VENV; .ci/run)")
    return Path(where)


def _both(tmp_path: Path, policy: str, *flags: str) -> dict[str, Any]:
    venv = _venv()
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    env.update(
        PATH=f"{venv / 'bin'}{os.pathsep}{env['PATH']}", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1"
    )
    done = subprocess.run(
        [str(venv / "bin" / "python"), str(SIDE), str(tmp_path), policy, "--", *flags],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=1200,
    )
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    # vfray's side imported verifiers itself, from the venv: no shim served the name.
    assert result["verifiers"].startswith(str(venv)), result["verifiers"]
    return result


def _by_key(rows: list[dict[str, Any]]) -> dict[str, list[tuple[Any, ...]]]:
    out: dict[str, list[tuple[Any, ...]]] = {}
    for r in rows:
        row = (r["rewards"], r["metrics"], r["stop_condition"], r["messages"], r["errors"])
        out.setdefault(r["key"], []).append(row)
    return {k: sorted(v, key=json.dumps) for k, v in out.items()}


@pytest.mark.slow
def test_reverse_text_scores_the_same_on_both_from_one_venv(tmp_path: Path) -> None:
    data = tmp_path / "reverse_text_data"
    data.mkdir()
    prompts = ["hello world", "abc def", "vfray", "side by side"]
    (data / "train.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    flags = ["reverse-text", "--env.taskset.dataset-name", str(data), "-n", "4"]
    flags += ["--env.agent.harness.id", "null", "--env.agent.runtime.type", "subprocess"]
    result = _both(tmp_path, "arithmetic", *flags)
    theirs, ours = result["theirs"], result["ours"]
    assert len(theirs) == len(ours) == 4
    assert _by_key(ours) == _by_key(theirs)
    assert {r["key"] for r in theirs} == {r["key"] for r in ours}
