"""Code shipping: a taskset defined in a test module, loaded from a file by path, imported from
an installed package, or defined in a notebook's ``__main__`` all run on remote Ray workers.

Each task records the pid its scoring ran in, so every test proves the rows came from a
SandboxHost process, not from the driver.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import vfray as vf
from vfray._plugins import load_object
from vfray.config import EvalConfig
from vfray.farm import Farm
from vfray.tasksets.arithmetic import ArithmeticTaskset, last_integer

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def farm(tmp_path: Path, **kw: Any) -> Farm:
    options: dict[str, Any] = {
        "model": "scripted:arithmetic",
        "harness": "null",
        "runtime": "subprocess",
        "output_dir": str(tmp_path),
        "progress": False,
        "max_concurrent": 16,
    }
    options.update(kw)
    return Farm(**options)


def scores(table: pa.Table, column: str, key: str) -> list[float | None]:
    """The value of ``key`` in a key/value score column, one per row."""
    return [
        next((pair["value"] for pair in row if pair["key"] == key), None)
        for row in table.column(column).to_pylist()
    ]


def assert_ran_remotely(table: pa.Table, rows: int) -> None:
    assert table.num_rows == rows
    assert all(table.column("ok").to_pylist()), table.column("error_message").to_pylist()
    # The scripted model answers every sum right, so each rollout's `correct` reward is 1.
    assert scores(table, "rewards", "correct") == [1.0] * rows
    pids = scores(table, "metrics", "worker_pid")
    assert None not in pids
    assert os.getpid() not in pids, "the scoring ran in the driver, not on a worker"


# -- (a) defined in the test module itself --------------------------------------------------


class LocalData(vf.TaskData):
    answer: int


class LocalTask(vf.Task[LocalData]):
    @vf.reward
    def correct(self, trace: vf.Trace) -> bool:
        return last_integer(trace.last_reply) == self.data.answer

    @vf.metric
    def worker_pid(self) -> int:
        return os.getpid()


class LocalTaskset(vf.Taskset[LocalTask]):
    def load(self) -> list[LocalTask]:
        return [
            LocalTask(LocalData(prompt=f"What is {i} + 3?", answer=i + 3), key=f"local-{i}")
            for i in range(4)
        ]


@pytest.mark.usefixtures("ray_local")
def test_taskset_defined_in_the_test_module_runs_on_workers(tmp_path: Path) -> None:
    with farm(tmp_path) as f:
        result = f.run(LocalTaskset(), rollouts_per_task=2)
    assert_ran_remotely(result.traces, 8)


# -- (b) loaded from a file by path ---------------------------------------------------------


@pytest.mark.usefixtures("ray_local")
def test_taskset_loaded_by_path_runs_on_workers(tmp_path: Path) -> None:
    taskset_cls = load_object(f"{FIXTURES / 'shipped_taskset.py'}:MyTaskset")
    module = taskset_cls.__module__
    assert module.startswith("vfray_plugin_"), "a path-loaded module gets a generated name"
    with farm(tmp_path) as f:
        result = f.run(taskset_cls(num_tasks=3), rollouts_per_task=2)
    table = result.traces
    assert_ran_remotely(table, 6)
    # The generated module name exists on the workers only because the code came by value.
    assert scores(table, "metrics", "module_importable") == [0.0] * 6
    # The group reward ran in the episode Ray task, another worker process.
    episode_pids = scores(table, "rewards", "episode_pid")
    assert None not in episode_pids and os.getpid() not in episode_pids
    assert result.episodes.num_rows == 3


# -- (c) from an installed package, with a scoring hook plugged in by file path ------------


@pytest.mark.usefixtures("ray_local")
def test_installed_package_taskset_runs_on_workers(tmp_path: Path) -> None:
    config = EvalConfig()
    # A config-plugged hook: the path string travels, and each worker loads the file itself.
    config.env.scoring = {"worker_pid": f"{FIXTURES / 'shipped_taskset.py'}:plugged_worker_pid"}
    with farm(tmp_path, config=config) as f:
        result = f.run(ArithmeticTaskset(num_tasks=4), rollouts_per_task=2)
    table = result.traces
    assert_ran_remotely(table, 8)
    assert set(table.column("task_type").to_pylist()) == {
        "vfray.tasksets.arithmetic:ArithmeticData"
    }
    # reward = correct + 0.1 * brevity_rank (a group reward, computed in the episode task).
    rewards = table.column("reward").to_pylist()
    assert all(r is not None and r >= 1.0 for r in rewards)
    assert None not in scores(table, "rewards", "brevity_rank")


# -- (d) defined in __main__, as in a notebook cell ----------------------------------------


@pytest.mark.slow
def test_taskset_defined_in_main_runs_on_workers(tmp_path: Path) -> None:
    """A real subprocess plays the notebook: its taskset lives in a file-less ``__main__`` and
    its Farm starts its own local Ray (kept on loopback), from inside a running event loop."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    done = subprocess.run(
        [sys.executable, "-", str(tmp_path)],
        input=(FIXTURES / "notebook_cell.py").read_text(),
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,  # nothing of the project is importable from here but the installed vfray
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["module"] == "__main__"
    assert report["rows"] == 6
    assert report["ok"] == [True] * 6
    assert report["rewards"] == [1.0] * 6
    assert len(report["worker_pids"]) == 6
    assert report["driver_pid"] not in report["worker_pids"]
