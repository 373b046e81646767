"""A run folder survives what goes wrong around it: resumes that leave one episode row per
group, episode rows lost between the trace and the episode flush, a full disk, a TraceSink that
dies mid-run or while compacting, a compaction that died, and a truncated Parquet part. Real
files, a real tmpfs, a real local Ray; the backends share the sink, so both are tested."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import vfray as vf
from vfray.cli.main import main
from vfray.errors import RunFolderError, SinkError
from vfray.farm import Farm
from vfray.run.results import RunResult
from vfray.run.resume import load_resume_state
from vfray.run.sink import TraceSink
from vfray.tasksets.arithmetic import ArithmeticTaskset
from vfray.trace import RewardRecord
from vfray.traces import TraceWriter, read_traces
from vfray.traces.convert import traces_to_table
from vfray.traces.episodes import EPISODE_SCHEMA, episodes_to_table
from vfray.traces.io import parquet_files, read_parquet
from vfray.traces.parts import REPLACES_KEY

pytestmark = pytest.mark.usefixtures("ray_local")
both_backends = pytest.mark.parametrize("backend", ["ray", "local"])


def farm(tmp_path: Path, **kw: Any) -> Farm:
    options: dict[str, Any] = {
        "model": "scripted:arithmetic?accuracy=0.5",
        "harness": "null",
        "runtime": "subprocess",
        "output_dir": str(tmp_path),
        "progress": False,
        "max_concurrent": 16,
    }
    options.update(kw)
    return Farm(**options)


def only_run_dir(output: Path) -> Path:
    (run_dir,) = [p for p in output.glob("*/*") if (p / "config.json").exists()]
    return run_dir


def assert_every_rollout_once(result: RunResult, tasks: int, n: int) -> None:
    traces = result.traces
    ids = traces.column("trace_id").to_pylist()
    assert len(ids) == len(set(ids)), "a trace row was written twice"
    final = result.final_traces
    pairs = Counter(
        zip(
            final.column("task_key").to_pylist(),
            final.column("rollout_index").to_pylist(),
            strict=True,
        )
    )
    assert len(pairs) == tasks * n and set(pairs.values()) == {1}
    assert all(final.column("ok").to_pylist())
    episodes = result.episodes
    assert episodes.num_rows == tasks
    assert len(set(episodes.column("task_key").to_pylist())) == tasks


# -- 1. a resume leaves one episode row per group -------------------------------------------


class FlakyData(vf.TaskData):
    marker: str


class FlakyTask(vf.Task[FlakyData]):
    """Fails its setup until a marker file exists; every rollout that runs is correct."""

    def setup(self, trace: vf.Trace, runtime: vf.Runtime) -> None:
        if not os.path.exists(self.data.marker):
            raise RuntimeError("not ready yet")

    @vf.reward
    def done(self, trace: vf.Trace) -> float:
        return 1.0


@both_backends
def test_resume_leaves_one_episode_row_per_task_and_right_pass_at_k(
    tmp_path: Path, backend: str
) -> None:
    marker = tmp_path / "ready"
    tasks = [
        FlakyTask(FlakyData(prompt=f"task {i}", marker=str(marker)), key=f"t{i}") for i in range(3)
    ]
    tasks.append(FlakyTask(FlakyData(prompt="fine", marker=str(tmp_path)), key="ok"))
    with farm(tmp_path, model="scripted:echo", backend=backend) as f:
        first = f.run(tasks, rollouts_per_task=2, name="flaky")
        assert first.summary()["pass@2"] == pytest.approx(0.25)
        marker.write_text("go")
        second = f.run(tasks, rollouts_per_task=2, resume=first.run_dir)
    assert_every_rollout_once(second, 4, 2)
    summary = second.summary()
    assert summary["pass@1"] == 1.0 and summary["pass@2"] == 1.0
    # Foreign readers of the compacted folder see one row per group too, with its advantages.
    foreign = pq.read_table(second.run_dir / "episodes")
    assert foreign.num_rows == 4
    assert foreign.column("num_ok").to_pylist() == [2, 2, 2, 2]
    assert len(pq.ParquetDataset(second.run_dir / "episodes").files) == 1


# -- 2. episode rows lost between the trace flush and the episode flush ---------------------


def drop_episode_rows(run_dir: Path, keys: set[str]) -> pa.Table:
    """The folder as a crash after the trace flush and before the episode flush leaves it."""
    folder = run_dir / "episodes"
    table = pq.read_table(folder)
    kept = table.filter(pa.array([k not in keys for k in table.column("task_key").to_pylist()]))
    shutil.rmtree(folder)
    folder.mkdir()
    pq.write_table(kept, folder / "part-00000.parquet")
    return table


def comparable(table: pa.Table) -> list[dict[str, Any]]:
    rows = table.drop_columns(["created_at"]).to_pylist()
    return sorted(rows, key=lambda row: row["task_key"])


def test_resume_rebuilds_lost_episode_rows_on_ray(tmp_path: Path) -> None:
    tasks = ArithmeticTaskset(num_tasks=10)
    with farm(tmp_path) as f:
        clean = f.run(tasks, rollouts_per_task=3)
        expected = clean.episodes
        lost = set(expected.column("task_key").to_pylist()[:4])
        drop_episode_rows(clean.run_dir, lost)
        assert clean.episodes.num_rows == 6
        resumed = f.run(tasks, rollouts_per_task=3, resume=clean.run_dir)
    assert resumed.traces.num_rows == 30  # no rollout ran again
    assert comparable(resumed.episodes) == comparable(expected)
    assert comparable(pq.read_table(resumed.run_dir / "episodes")) == comparable(expected)


def test_cli_resume_rebuilds_lost_episode_rows_locally(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tasks = ArithmeticTaskset(num_tasks=10)
    with farm(tmp_path, backend="local") as f:
        clean = f.run(tasks, rollouts_per_task=3)
    expected = clean.episodes
    drop_episode_rows(clean.run_dir, set(expected.column("task_key").to_pylist()[3:8]))
    header = json.loads((clean.run_dir / "config.json").read_text())
    header["config"]["taskset_args"] = {"num_tasks": 10}
    (clean.run_dir / "config.json").write_text(json.dumps(header))
    code = main(["resume", str(clean.run_dir), "--no-progress"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "nothing to resume" not in out
    assert RunResult(clean.run_dir).traces.num_rows == 30
    assert comparable(RunResult(clean.run_dir).episodes) == comparable(expected)


# -- 3. a full disk ---------------------------------------------------------------------------


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 192 KiB tmpfs (we run as root here); grow it with :func:`grow`."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=192k", "tmpfs", str(mount)],
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def grow(mount: Path) -> None:
    subprocess.run(["mount", "-o", "remount,size=64m", str(mount)], check=True)


def test_trace_writer_keeps_rows_when_a_write_fails(tiny_disk: Path) -> None:
    tasks = ArithmeticTaskset(num_tasks=4)
    traces = [vf.Trace(task=task.record(), rollout_index=0) for task in tasks.load()]
    (tiny_disk / "filler").write_bytes(os.urandom(190 * 1024))  # leave almost nothing
    writer = TraceWriter(tiny_disk / "traces", flush_rows=100)
    writer.write(traces)
    with pytest.raises(OSError):
        writer.flush()
    assert writer.buffered_rows == 4
    assert [p.name for p in (tiny_disk / "traces").iterdir()] == []  # no half-written file
    grow(tiny_disk)
    writer.close()
    assert read_traces(tiny_disk / "traces").column("trace_id").to_pylist() == [
        t.trace_id for t in traces
    ]


async def test_a_full_disk_never_leaves_an_episode_row_without_its_traces(
    tiny_disk: Path,
) -> None:
    """The traces' part is the big one: with room for the episode row's part only, neither is
    written, and both are once there is room."""
    task = next(iter(ArithmeticTaskset(num_tasks=1).load()))
    traces = [vf.Trace(task=task.record(), rollout_index=i) for i in range(2)]
    for trace in traces:
        trace.notes.append(os.urandom(40 * 1024).hex())  # ~40 KiB of part each, compressed
    episode = episodes_to_table([vf.Episode(task=task.record(), traces=traces)])
    sink = TraceSink(str(tiny_disk / "run"), {}, flush_rows=1000, flush_seconds=3600)
    (tiny_disk / "filler").write_bytes(os.urandom(150 * 1024))  # room for ~30 KiB
    await sink.append(traces_to_table(traces), episode, key=task.key)
    with pytest.raises(SinkError):
        await sink.flush()
    assert parquet_files(tiny_disk / "run" / "traces") == []
    assert parquet_files(tiny_disk / "run" / "episodes") == [], "episode row before its traces"
    assert RunResult(tiny_disk / "run").summary()["rollouts"] == 0
    grow(tiny_disk)
    assert await sink.flush() == [task.key]
    await sink.close()
    result = RunResult(tiny_disk / "run")
    assert result.episodes.num_rows == 1 and result.traces.num_rows == 2


def test_an_episode_row_whose_traces_are_missing_is_not_counted(tmp_path: Path) -> None:
    """A folder that an older sink left after a full disk: the episode row is on disk, its
    traces are not. It counts neither in pass@k nor as a group."""
    tasks = list(ArithmeticTaskset(num_tasks=2).load())
    solved = {"correct": RewardRecord(value=1.0)}
    groups = [
        [vf.Trace(task=t.record(), rollout_index=i, rewards=solved) for i in range(2)]
        for t in tasks
    ]
    with TraceWriter(tmp_path / "traces") as writer:
        writer.write(groups[0])  # the second group's trace rows never made it to disk
    episodes = [vf.Episode(task=t.record(), traces=g) for t, g in zip(tasks, groups, strict=True)]
    with TraceWriter(tmp_path / "episodes") as writer:
        writer.write(episodes_to_table(episodes))
    (tmp_path / "config.json").write_text("{}")
    result = RunResult(tmp_path)
    assert result.episodes.column("task_key").to_pylist() == [tasks[0].key]
    summary = result.summary()
    assert summary["rollouts"] == 2 and summary["pass@1"] == 1.0


@both_backends
def test_full_disk_stops_the_run_with_one_line_and_resume_completes_it(
    tiny_disk: Path, backend: str
) -> None:
    tasks = ArithmeticTaskset(num_tasks=40)
    # Most of the disk is taken already, so a few flushed parts fill it.
    (tiny_disk / "filler").write_bytes(os.urandom(144 * 1024))
    with farm(
        tiny_disk,
        model="scripted:arithmetic?latency=0.05",
        backend=backend,
        max_concurrent=6,
        flush_seconds=0.3,
    ) as f:
        with pytest.raises(SinkError) as info:
            f.run(tasks, rollouts_per_task=2)
        message = str(info.value)
        run_dir = only_run_dir(tiny_disk)
        assert "\n" not in message
        assert str(run_dir) in message and "vfray resume" in message
        # Before the resume: no episode row on disk whose trace rows are not, and what `vfray
        # show` counts is what is on disk.
        on_disk = read_parquet(run_dir / "episodes", EPISODE_SCHEMA)
        written = set(read_traces(run_dir / "traces").column("trace_id").to_pylist())
        assert [
            ids for ids in on_disk.column("trace_ids").to_pylist() if not set(ids) <= written
        ] == []
        stopped = RunResult(run_dir)
        summary = stopped.summary()
        assert summary["rollouts"] == stopped.final_traces.num_rows
        if summary["rollouts"] == 0:
            assert not [k for k in summary if k.startswith("pass@")], summary
        grow(tiny_disk)
        result = f.run(tasks, rollouts_per_task=2, resume=run_dir)
    assert_every_rollout_once(result, 40, 2)


# -- 4. the TraceSink actor dies --------------------------------------------------------------


def sink_pids() -> list[int]:
    """PIDs of the TraceSink actors of the Ray this test process started (its descendants)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    mine = {os.getpid()}
    changed = True
    while changed:
        changed = False
        for pid, parent in parents.items():
            if parent in mine and pid not in mine:
                mine.add(pid)
                changed = True
    found = []
    for pid in mine:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if cmdline.startswith(b"ray::TraceSink"):
            found.append(pid)
    return found


def kill_sink_when(condition: Any, killed: list[int], timeout: float = 120) -> threading.Thread:
    def watch() -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pids = sink_pids()
            if pids and condition():
                for pid in pids:
                    os.kill(pid, 9)
                    killed.append(pid)
                return
            time.sleep(0.002)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_sink_killed_mid_run_loses_and_doubles_nothing(tmp_path: Path) -> None:
    tasks = ArithmeticTaskset(num_tasks=60)
    killed: list[int] = []
    first_seen: list[float] = []

    def run_going() -> bool:
        # ~8 s of rollouts (120 x 0.5 s, 8 at a time): kill the sink 2.5 s into them.
        first_seen.append(time.monotonic())
        return first_seen[-1] - first_seen[0] > 2.5

    with farm(
        tmp_path, model="scripted:arithmetic?latency=0.5", max_concurrent=8, flush_seconds=60
    ) as f:
        # Rows sit in the sink's buffer (no timed flush for a minute) when it dies.
        watcher = kill_sink_when(run_going, killed)
        result = f.run(tasks, rollouts_per_task=2)
        ended = time.monotonic()
        watcher.join(timeout=1)
    assert killed, "the sink was never killed"
    assert first_seen[-1] < ended - 1, "the sink was killed after the run"
    assert_every_rollout_once(result, 60, 2)


@pytest.mark.timeout(600)  # up to three runs, on a machine that may be loaded
def test_sink_killed_while_compacting_does_not_fail_the_run(tmp_path: Path) -> None:
    tasks = ArithmeticTaskset(num_tasks=50)
    killed: list[int] = []
    # The compaction at close lasts a fraction of a second; on a loaded machine the watcher can
    # miss it. Each attempt is a whole checked run; up to three are made to land the kill.
    for attempt in range(3):
        root = tmp_path / f"attempt-{attempt}"
        with farm(root, flush_rows=1, max_concurrent=8) as f:

            def compacting(root: Path = root) -> bool:
                folders = [d / "traces" for d in root.glob("*/*")]
                return any(
                    p.name.startswith(".compact-")
                    for folder in folders
                    if folder.is_dir()
                    for p in folder.iterdir()
                )

            watcher = kill_sink_when(compacting, killed)
            result = f.run(tasks, rollouts_per_task=2)
            watcher.join(timeout=1)
        assert_every_rollout_once(result, 50, 2)
        # Finished compactions (the restarted sink's, where it was killed): readers see every
        # row once.
        for table, rows in (("traces", 100), ("episodes", 50)):
            folder = result.run_dir / table
            assert not [p for p in folder.iterdir() if p.name.startswith(".")]
            assert pq.read_table(folder).num_rows == rows
        if killed:
            break
    assert killed, "the sink finished compacting before it could be killed, three times"


# -- 5. leftovers of a dead compaction; RunResult paths --------------------------------------


def test_resume_with_nothing_to_do_finishes_a_dead_compaction(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with farm(tmp_path, backend="local", flush_rows=4) as f:
        result = f.run(ArithmeticTaskset(num_tasks=6), rollouts_per_task=2)
    folder = result.run_dir / "traces"
    (merged,) = list(folder.iterdir())
    replaced = json.loads(pq.read_schema(merged).metadata[REPLACES_KEY])
    # A compaction died after linking its merged part in and before deleting the old parts
    # (one is back), and another died before linking its temporary file in.
    table = pq.read_table(merged)
    pq.write_table(table.slice(0, 4), folder / replaced[0])
    shutil.copy2(merged, folder / ".compact-0123456789abcdef.parquet")
    assert pq.read_table(folder).num_rows == 16  # what pandas or datasets would see
    header = json.loads((result.run_dir / "config.json").read_text())
    header["config"]["taskset_args"] = {"num_tasks": 6}
    (result.run_dir / "config.json").write_text(json.dumps(header))
    assert main(["resume", str(result.run_dir), "--no-progress"]) == 0
    assert "nothing to resume" in capsys.readouterr().out
    assert sorted(p.name for p in folder.iterdir()) == [merged.name]
    assert pq.read_table(folder).num_rows == 12


def test_run_result_accepts_str_and_pathlike(tmp_path: Path) -> None:
    with farm(tmp_path, backend="local") as f:
        result = f.run(ArithmeticTaskset(num_tasks=2), rollouts_per_task=2)
    for path in (str(result.run_dir), result.run_dir, PurePosixPath(result.run_dir)):
        again = RunResult(path)
        assert again.traces.num_rows == 4
        assert again.episodes.num_rows == 2
        assert again == result


# -- a truncated part --------------------------------------------------------------------------


def test_truncated_part_is_one_typed_error_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with farm(tmp_path, backend="local") as f:
        result = f.run(ArithmeticTaskset(num_tasks=3), rollouts_per_task=2)
    (part,) = list((result.run_dir / "traces").iterdir())
    data = part.read_bytes()
    part.write_bytes(data[: len(data) // 2])
    with pytest.raises(RunFolderError, match=part.name):
        load_resume_state(result.run_dir)
    for command in (["show", str(result.run_dir)], ["resume", str(result.run_dir)]):
        assert main(command) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("vfray: error: cannot read ") and str(part) in err
        assert "\n" not in err and "Traceback" not in err
    # The episodes table is still readable on its own.
    assert RunResult(result.run_dir).episodes.schema.equals(EPISODE_SCHEMA, check_metadata=False)
