"""vfray sets the garbage collector's thresholds (:mod:`vfray.owned_process`) in the processes it
owns and nowhere else. A task's metric reads them where the task is scored: a SandboxHost
actor's process on the ray backend (tuned), the caller's own process on the local backend (left
as it was). The ``vfray`` command's own process is tuned; a caller of ``main(argv)`` is not."""

from __future__ import annotations

import gc
import subprocess
import sys
from pathlib import Path

import pytest

import vfray as vf
from vfray.farm import Farm
from vfray.owned_process import GC_THRESHOLDS


class ReadsThresholds(vf.Task[vf.TaskData]):
    @vf.reward
    def answered(self, trace: vf.Trace) -> bool:
        return bool(trace.last_reply)

    @vf.metric
    def gc_gen0(self) -> int:
        return gc.get_threshold()[0]


class ThresholdTasks(vf.Taskset[ReadsThresholds]):
    def load(self) -> list[ReadsThresholds]:
        return [ReadsThresholds(vf.TaskData(prompt=f"say {i}"), key=f"t{i}") for i in range(2)]


def gen0_where_scored(tmp_path: Path, backend: str) -> set[int]:
    farm = Farm(
        model="scripted:echo",
        harness="null",
        runtime="subprocess",
        output_dir=str(tmp_path),
        progress=False,
        backend=backend,
    )
    with farm as f:
        table = f.run(ThresholdTasks(), rollouts_per_task=2).traces
    assert all(table.column("ok").to_pylist()), table.column("error_message").to_pylist()
    metrics = table.column("metrics").to_pylist()
    return {pair["value"] for row in metrics for pair in row if pair["key"] == "gc_gen0"}


@pytest.mark.usefixtures("ray_local")
def test_a_sandbox_hosts_process_is_tuned(tmp_path: Path) -> None:
    assert gen0_where_scored(tmp_path, "ray") == {GC_THRESHOLDS[0]}


def test_the_callers_process_is_left_as_it_was(tmp_path: Path) -> None:
    # The caller's own thresholds, set here: another test of this worker may have built a
    # SandboxHost in this process (tests/test_run_spec.py does).
    before = gc.get_threshold()
    mine = (701, 11, 11)
    gc.set_threshold(*mine)
    try:
        assert gen0_where_scored(tmp_path, "local") == {mine[0]}
        assert gc.get_threshold() == mine
    finally:
        gc.set_threshold(*before)


READ_AFTER_MAIN = """
import atexit, gc, sys
from vfray.cli.main import main
atexit.register(lambda: print(*gc.get_threshold()))
if sys.argv[1] == "command":
    sys.argv = ["vfray", "--help"]
    main()
else:
    main(["--help"])
"""


@pytest.mark.parametrize(("how", "tuned"), [("command", True), ("caller", False)])
def test_the_vfray_commands_process_is_tuned_and_a_caller_of_main_is_not(
    how: str, tuned: bool
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", READ_AFTER_MAIN, how], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    found = tuple(int(n) for n in done.stdout.strip().splitlines()[-1].split())
    assert (found == GC_THRESHOLDS) is tuned, found
