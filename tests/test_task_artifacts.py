"""``TaskData.artifacts``: files a task names are read from the box after ``finalize`` and kept
on the trace (so in the run folder); a required one that is missing fails the rollout's finalize
phase as the task's error, an optional one is skipped. Real rollouts, scripted model."""

from __future__ import annotations

from pathlib import Path

import pytest

import vfray as vf
from vfray.runtimes.base import Runtime
from vfray.task import Artifact


class Writes(vf.Task[vf.TaskData]):
    """Leaves a report in the box at finalize (as a task running a test suite would)."""

    async def finalize(self, trace: vf.Trace, runtime: Runtime) -> None:
        await runtime.write("out/report.txt", b"3 passed\n")

    @vf.reward
    def one(self) -> float:
        return 1.0


@pytest.mark.parametrize("runtime", ["subprocess", "bwrap"])
async def test_named_files_are_kept_on_the_trace_and_in_the_run_folder(
    runtime: str, tmp_path: Path
) -> None:
    if runtime == "bwrap":
        import shutil

        if shutil.which("bwrap") is None:
            pytest.skip("bwrap not installed")
    data = vf.TaskData(
        prompt="2+2?",
        artifacts=[Artifact(path="out/report.txt"), Artifact(path="maybe.log", required=False)],
    )
    trace = await vf.run_rollout(
        Writes(data), model="scripted:echo", harness="null", runtime=runtime
    )
    assert trace.errors == [], trace.errors
    assert [(a.name, a.content) for a in trace.artifacts] == [("out/report.txt", "3 passed\n")]
    assert trace.rewards["one"].value == 1.0

    from vfray.traces import read_traces, write_traces
    from vfray.traces.convert import table_to_traces

    write_traces([trace], tmp_path / "t.parquet")
    (back,) = table_to_traces(read_traces(tmp_path / "t.parquet"))
    assert back.artifacts == trace.artifacts


async def test_a_missing_required_file_fails_finalize_as_the_tasks_error() -> None:
    data = vf.TaskData(prompt="2+2?", artifacts=[Artifact(path="never/written.txt")])
    trace = await vf.run_rollout(Writes(data), model="scripted:echo", harness="null")
    assert [e.type for e in trace.errors] == ["TaskError"]
    assert "required artifact never/written.txt not in the box" in trace.errors[0].message
    assert trace.errors[0].phase == "finalize"
    # Scoring still ran: the partial rollout is data.
    assert trace.rewards["one"].value == 1.0
