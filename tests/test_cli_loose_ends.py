"""Loose ends of the CLI met in production (issue 27, item 13), through the real ``python -m
vfray`` in a subprocess: a taskset whose first task fails to build, errors grouped by type,
phase and message, ``vfray resume --backend``, a key pasted into ``--api-key-var``, and a
misspelt scripted policy refused before Ray starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.test_cli_first_hour import LOCAL, one_error_line, run_folder, vfray

BROKEN_LOAD = """
import vfray as vf


class Data(vf.TaskData):
    word: str


class Plain(vf.Task[Data]):
    @vf.reward
    def said(self, trace: vf.Trace) -> bool:
        return True


class Broken(vf.Taskset):  # no Task class declared: finding it builds the first task
    def load(self):
        raise FileNotFoundError("data/train.jsonl")
"""

TWO_FAILURES = """
import os
from pathlib import Path

import vfray as vf

BROKEN = Path(os.environ["LOOSE_ENDS_MARKER"])


class Data(vf.TaskData):
    where: str


class Fragile(vf.Task[Data]):
    def setup(self, trace, runtime):
        if BROKEN.exists() and self.data.where == "setup":
            raise RuntimeError("the fixture database is missing")

    def finalize(self, trace, runtime):
        if BROKEN.exists() and self.data.where == "finalize":
            raise RuntimeError("could not copy the answer file out")

    @vf.reward
    def ok(self, trace: vf.Trace) -> bool:
        return True


class Tasks(vf.Taskset[Fragile]):
    def load(self):
        phases = ["setup"] * 5 + ["finalize"] * 3
        return [
            Fragile(Data(prompt=f"task {i}", where=p), key=f"t{i}") for i, p in enumerate(phases)
        ]
"""


def test_a_taskset_failing_on_its_first_task_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text(BROKEN_LOAD)
    proc = vfray("eval", "broken.py:Broken", *LOCAL, "-o", str(tmp_path / "out"), cwd=tmp_path)
    assert proc.returncode == 2
    one_error_line(proc, "taskset 'broken'", "first task", "FileNotFoundError: data/train.jsonl")


@pytest.fixture
def failed_run(tmp_path: Path) -> tuple[Path, str, dict[str, str]]:
    """A local run of 8 tasks: 5 fail in setup, 3 in finalize with another message."""
    from tests.test_cli import cli_env

    (tmp_path / "fragile.py").write_text(TWO_FAILURES)
    marker = tmp_path / "broken"
    marker.touch()
    env = {**cli_env(), "LOOSE_ENDS_MARKER": str(marker)}
    proc = vfray(
        "eval", "fragile.py:Tasks", *LOCAL, "-o", str(tmp_path / "out"), "--no-progress",
        cwd=tmp_path, env=env,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-3000:]
    return run_folder(proc.stdout), proc.stdout, env


def test_errors_are_grouped_by_type_phase_and_message(
    failed_run: tuple[Path, str, dict[str, str]],
) -> None:
    _, stdout, _ = failed_run
    lines = [line.strip() for line in stdout.splitlines() if line.strip().startswith("TaskError")]
    assert len(lines) == 2, stdout
    assert lines[0].startswith("TaskError x5 in setup:") and "fixture database" in lines[0]
    assert lines[1].startswith("TaskError x3 in finalize:") and "answer file" in lines[1]


def test_resume_takes_backend(failed_run: tuple[Path, str, dict[str, str]]) -> None:
    folder, _, env = failed_run
    marker = Path(env["LOOSE_ENDS_MARKER"])
    marker.unlink()
    # The run as if made on Ray: --backend local must resume it here, without starting Ray.
    header_path = folder / "config.json"
    header = json.loads(header_path.read_text())
    header["config"]["backend"] = "ray"
    header_path.write_text(json.dumps(header))
    proc = vfray(
        "resume", str(folder), "--backend", "local", "--no-progress", cwd=marker.parent, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "8 / 8" in proc.stdout
    assert "Ray" not in proc.stderr, proc.stderr[-3000:]
    both = vfray("resume", str(folder), "--backend", "local", "--address", "10.0.0.1:6379")
    one_error_line(both, "--address", "drop one of them")


@pytest.mark.parametrize(
    "value", ["sk-proj-4fA9xQ2LmZ7bT1cD8eR3", "a8f3c91b2d4e5f60718293a4b5c6d7e8f9"]
)
def test_a_key_given_as_api_key_var_is_never_echoed(tmp_path: Path, value: str) -> None:
    for extra in ([], ["--dry-run"]):
        proc = vfray(
            "eval", "arithmetic", "-m", "gpt-4o", "--base-url", "http://127.0.0.1:9/v1",
            "--api-key-var", value, "-o", str(tmp_path), *extra,
        )  # fmt: skip
        one_error_line(proc, "--api-key-var", "looks like a key", "not shown")
        assert value not in proc.stdout + proc.stderr
    assert not list(tmp_path.iterdir())  # no eval.log or config.json holding it either


def test_a_misspelt_scripted_policy_is_refused_before_ray(tmp_path: Path) -> None:
    # The default backend (Ray): the check must come before Ray's start-up.
    proc = vfray("eval", "arithmetic", "--model", "scripted:agnet", "-o", str(tmp_path))
    one_error_line(proc, "unknown scripted policy 'agnet'", "did you mean 'agent'?")
    assert "Ray" not in proc.stderr
    local = vfray("eval", "arithmetic", "--model", "scripted:agnet", *LOCAL, "-o", str(tmp_path))
    one_error_line(local, "unknown scripted policy 'agnet'")


def test_init_prints_next_steps_the_quick_start_venv_can_run(tmp_path: Path) -> None:
    """The quick start installs vfray alone (``pip install -e .``): no pytest. Every command
    ``vfray init`` suggests is one that venv has, or installs what it needs first."""
    import tomllib

    root = Path(__file__).parents[1]
    deps = tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]
    assert not any(d.split()[0].startswith("pytest") for d in deps)  # what the venv lacks
    proc = vfray("init", "word-check", "--dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    available = ("cd", "pip", "vfray", "python")
    for line in proc.stdout.splitlines():
        if not line.startswith(("next:", "then:", "tests:")):
            continue
        installed: set[str] = set()
        for command in line.split(":", 1)[1].split("(")[0].split("&&"):
            words = command.split()
            if words[:2] == ["pip", "install"]:
                installed |= set(words[2:])
            assert words[0] in available or words[0] in installed, line
    readme = (tmp_path / "word-check" / "README.md").read_text()
    assert "pip install pytest && pytest" in readme


def test_error_groups_fold_numbers_and_cap_their_count() -> None:
    import pyarrow as pa

    from vfray.run.error_examples import MAX_GROUPS, first_errors

    rows = [
        {"error_type": "HarnessError", "error_message": f"exit code {i} after {i * 7} s",
         "error_phase": "agent", "task_key": f"k{i}", "rollout_index": 0}
        for i in range(4)
    ] + [
        {"error_type": "TaskError", "error_message": f"check {word} broke",
         "error_phase": "scoring", "task_key": word, "rollout_index": 1}
        for word in [chr(ord("a") + i) * 3 for i in range(MAX_GROUPS + 3)]
    ]  # fmt: skip
    examples = first_errors(pa.Table.from_pylist(rows))
    assert (examples[0].type, examples[0].count, examples[0].task_key) == ("HarnessError", 4, "k0")
    assert len(examples) == MAX_GROUPS + 1  # 1 + (MAX_GROUPS - 1) shown, 4 folded into one
    assert examples[-1].count == 4 and examples[-1].message.startswith("(4 kinds of message")
    assert sum(e.count for e in examples) == len(rows)
