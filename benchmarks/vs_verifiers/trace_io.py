"""Trace IO: writing and reading one run's traces, vfray's Parquet parts vs verifiers v1's
``traces.jsonl``, with each framework's own reader and writer.

Both sides first run the arithmetic taskset for real (vfray: N x 4; verifiers: a smaller run whose
episode lines are then repeated up to the same trace count, since its per-rollout program makes a
full run slow). Then: vfray ``read_traces`` (Arrow table), ``table_to_traces`` (typed ``Trace``
objects), ``write_traces`` (one Parquet part); verifiers ``json.loads`` per line,
``read_episodes`` (typed, as resume/replay read) and ``write_episode`` per episode (as its eval
appends). Prints seconds, traces/s, bytes, and ratios.

    python benchmarks/vs_verifiers/trace_io.py [--tasks 200 --vf-tasks 25]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

from benchmarks.vs_verifiers import common


def _vfray_side(files: list[Path]) -> dict[str, Any]:
    from vfray.traces.convert import table_to_traces
    from vfray.traces.io import read_traces, write_traces

    folder = files[0].parent
    start = time.perf_counter()
    table = read_traces(folder)
    read_table = time.perf_counter() - start
    start = time.perf_counter()
    traces = table_to_traces(table)
    to_objects = time.perf_counter() - start
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        written = write_traces(traces, out)
        write = time.perf_counter() - start
        size = written.stat().st_size
    return {
        "traces": len(traces),
        "bytes": sum(f.stat().st_size for f in files),
        "written_bytes": size,
        "read_table_s": read_table,
        "read_typed_s": read_table + to_objects,
        "write_s": write,
    }


def _verifiers_side(files: list[Path], target: int) -> dict[str, Any]:
    lines = [line for line in files[0].read_text().splitlines() if line.strip()]
    per_line = max(1, sum(len(json.loads(line)["traces"]) for line in lines) // len(lines))
    with tempfile.TemporaryDirectory() as folder:
        # Repeat the real episode lines up to the target trace count (ids repeat; nothing
        # in the reader or writer depends on them being unique).
        wanted = max(1, target // per_line)
        repeated = [lines[i % len(lines)] for i in range(wanted)]
        (Path(folder) / "traces.jsonl").write_text("\n".join(repeated) + "\n")
        script = common.VF_SIDE / "trace_io.py"
        done = subprocess.run(
            [str(common.ensure_venv()), str(script), folder],
            capture_output=True,
            text=True,
            check=True,
        )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def measure(tasks: int, vf_tasks: int, rollouts: int = 4) -> dict[str, Any]:
    with common.scripted_model(0.0) as url:
        ours = common.vfray_eval(url, tasks, rollouts, 64, 1800)
        theirs = common.verifiers_eval(url, vf_tasks, rollouts, 32, 1800)
    try:
        v_files = common.vfray_finished(ours.out_dir).trace_files
        f_files = common.verifiers_finished(theirs.out_dir).trace_files
        if not v_files or not f_files:
            raise RuntimeError(f"a run wrote no traces: {ours.stderr_tail}{theirs.stderr_tail}")
        v = _vfray_side(v_files)
        f = _verifiers_side(f_files, v["traces"])
    finally:
        common.cleanup(ours)
        common.cleanup(theirs)
    out: dict[str, Any] = {"vfray": v, "verifiers": f}
    for side in (v, f):
        side["bytes_per_trace"] = side["bytes"] / side["traces"]
        side["read_traces_per_s"] = side["traces"] / side["read_typed_s"]
        side["write_traces_per_s"] = side["traces"] / side["write_s"]
    out["ratio_read_typed"] = common.ratio(f["read_typed_s"], v["read_typed_s"])
    out["ratio_read_raw"] = common.ratio(f["read_json_s"], v["read_table_s"])
    out["ratio_write"] = common.ratio(f["write_s"], v["write_s"])
    out["ratio_bytes"] = common.ratio(v["bytes_per_trace"], f["bytes_per_trace"])
    return out


def report(out: dict[str, Any]) -> None:
    v, f = out["vfray"], out["verifiers"]
    print(
        f"{'':<10}{'traces':>8}{'B/trace':>9}{'read raw s':>12}{'read typed s':>14}{'write s':>10}"
    )
    print(
        f"{'vfray':<10}{v['traces']:>8}{v['bytes_per_trace']:>9.0f}{v['read_table_s']:>12.3f}"
        f"{v['read_typed_s']:>14.3f}{v['write_s']:>10.3f}"
    )
    print(
        f"{'verifiers':<10}{f['traces']:>8}{f['bytes_per_trace']:>9.0f}{f['read_json_s']:>12.3f}"
        f"{f['read_typed_s']:>14.3f}{f['write_s']:>10.3f}"
    )
    print(
        f"vfray speed-up: read raw {out['ratio_read_raw']:.1f}x, read typed"
        f" {out['ratio_read_typed']:.1f}x, write {out['ratio_write']:.1f}x;"
        f" bytes per trace vfray/verifiers {out['ratio_bytes']:.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--vf-tasks", type=int, default=25)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    out = measure(args.tasks, args.vf_tasks)
    report(out)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
