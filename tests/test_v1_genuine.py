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


SITECUSTOMIZE = """\
# Written by tests/test_v1_genuine.py: the hub datasets named in VFRAY_TEST_DATASETS (a JSON
# file, {name: rows}) are these local rows, in vf-eval and in vfray alike (each imports this).
import json as _json
import os as _os

_where = _os.environ.get("VFRAY_TEST_DATASETS")
try:
    import datasets as _datasets
except ImportError:  # a process of another interpreter (a uv script) that reads no dataset
    _datasets = None
if _where and _datasets is not None:
    with open(_where) as _f:
        _ROWS = _json.load(_f)
    _load = _datasets.load_dataset

    def _local(path, *args, **kwargs):
        if path in _ROWS:
            return _datasets.Dataset.from_list(_ROWS[path])
        return _load(path, *args, **kwargs)

    _datasets.load_dataset = _local
"""


def _both(
    tmp_path: Path,
    policy: str,
    *flags: str,
    datasets: dict[str, list[dict[str, Any]]] | None = None,
) -> dict[str, Any]:
    venv = _venv()
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    env.update(
        PATH=f"{venv / 'bin'}{os.pathsep}{env['PATH']}", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1"
    )
    if datasets:
        site = tmp_path / "site"
        site.mkdir()
        (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
        (tmp_path / "datasets.json").write_text(json.dumps(datasets))
        env["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [env.get("PYTHONPATH")])])
        env["VFRAY_TEST_DATASETS"] = str(tmp_path / "datasets.json")
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


def _same(result: dict[str, Any], rows: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    theirs, ours = result["theirs"], result["ours"]
    assert len(theirs) == len(ours) == rows
    assert _by_key(ours) == _by_key(theirs)
    return theirs, ours


GSM8K = [
    {"question": "What is 12 + 30?", "answer": "12 + 30 = 42\n#### 42"},
    {"question": "What is 7 times 6 minus 2?", "answer": "7 * 6 - 2 = 40\n#### 40"},
    {"question": "Tom has some apples.", "answer": "#### 5"},
]


@pytest.mark.slow
def test_gsm8k_scores_the_same_through_its_uv_verifier(tmp_path: Path) -> None:
    # Its setup prepares verify.py (math-verify, from PyPI) in the box's uv cache, its reward
    # runs it there: both sides, on the same three local rows instead of openai/gsm8k.
    flags = ["gsm8k", "-n", "3", "--env.agent.harness.id", "null"]
    flags += ["--env.agent.runtime.type", "subprocess"]
    result = _both(tmp_path, "arithmetic", *flags, datasets={"openai/gsm8k": GSM8K})
    theirs, _ = _same(result, 3)
    # What both scored: the two sums right, the question with no arithmetic wrong.
    assert sorted(r["rewards"]["correct"] for r in theirs) == [0.0, 1.0, 1.0]
    assert all(not r["errors"] for r in theirs)
