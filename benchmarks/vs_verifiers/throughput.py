"""Throughput: the arithmetic taskset (N tasks x 4 rollouts), the tool-less chat harness, the local
subprocess runtime and one shared scripted model, run by ``vfray eval`` and by verifiers'
``vf-eval``; rollouts/s (end to end, and over the run phase: first
rollout start to last rollout end) and peak memory of each, and the ratio vfray / verifiers.

    python benchmarks/vs_verifiers/throughput.py                      # 200 x 4, c=32,256, 0 s,1 s
    python benchmarks/vs_verifiers/throughput.py --tasks 20 --vf-tasks 8 --latency 0 -c 32
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

from benchmarks.vs_verifiers import common


def one_side(
    side: str, url: str, tasks: int, rollouts: int, c: int, timeout: float
) -> dict[str, Any]:
    run = common.vfray_eval if side == "vfray" else common.verifiers_eval
    read = common.vfray_finished if side == "vfray" else common.verifiers_finished
    measured = run(url, tasks, rollouts, c, timeout)
    done = read(measured.out_dir)
    # Run-phase rate: from the first rollout's start to the last one's end, so the command's
    # start-up (imports, Ray) and shutdown are left out; cold_start.py measures those.
    span = done.ends[-1] - done.first_start if done.ends and done.first_start else 0.0
    result = {
        "side": side,
        "tasks": tasks,
        "rollouts": tasks * rollouts,
        "concurrency": c,
        "ok": done.ok,
        "finished": done.total,
        "wall_s": measured.wall,
        "rollouts_per_s": done.ok / measured.wall,
        "steady_rollouts_per_s": done.ok / span if span > 0 else None,
        "first_finish_s": done.ends[0] - measured.launched if done.ends else None,
        "peak_rss_gib": common.gib(measured.peak_rss),
        "returncode": measured.returncode,
    }
    if measured.returncode != 0 or done.ok < tasks * rollouts:
        result["stderr_tail"] = measured.stderr_tail[-800:]
    common.cleanup(measured)
    return result


def measure(
    tasks: int,
    vf_tasks: int,
    rollouts: int,
    concurrencies: list[int],
    latencies: list[float],
    timeout: float,
    max_vf_gib: float,
) -> list[dict[str, Any]]:
    """One row per (latency, concurrency): both sides, their figures and the ratios."""
    rows = []
    vf_per_rollout_gib: float | None = None
    for latency in latencies:
        for c in sorted(concurrencies):
            with common.scripted_model(latency) as url:
                ours = one_side("vfray", url, tasks, rollouts, c, timeout)
                need = None if vf_per_rollout_gib is None else vf_per_rollout_gib * c
                if need is not None and need > max_vf_gib:
                    theirs: dict[str, Any] = {
                        "side": "verifiers",
                        "skipped": f"would need ~{need:.1f} GiB (> {max_vf_gib:.1f} GiB allowed)",
                        "predicted_peak_rss_gib": need,
                    }
                else:
                    theirs = one_side("verifiers", url, vf_tasks, rollouts, c, timeout)
                    in_flight = min(c, vf_tasks * rollouts)
                    per = theirs["peak_rss_gib"] / in_flight
                    vf_per_rollout_gib = max(vf_per_rollout_gib or 0.0, per)
            row = {"latency": latency, "concurrency": c, "vfray": ours, "verifiers": theirs}
            row["ratio_rollouts_per_s"] = common.ratio(
                ours["rollouts_per_s"], theirs.get("rollouts_per_s")
            )
            row["ratio_steady"] = common.ratio(
                ours["steady_rollouts_per_s"], theirs.get("steady_rollouts_per_s")
            )
            # A skipped verifiers run is compared with its predicted peak (flagged in the table).
            their_peak = theirs.get("peak_rss_gib", theirs.get("predicted_peak_rss_gib"))
            row["ratio_peak_rss"] = common.ratio(ours["peak_rss_gib"], their_peak)
            rows.append(row)
            print_row(row)
    return rows


def _fmt(value: Any, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def print_row(row: dict[str, Any]) -> None:
    for side in ("vfray", "verifiers"):
        r = row[side]
        if "skipped" in r:
            print(
                f"  latency {row['latency']:g}s c={row['concurrency']:<4} {side:<10} {r['skipped']}"
            )
            continue
        print(
            f"  latency {row['latency']:g}s c={row['concurrency']:<4} {side:<10}"
            f" {r['ok']}/{r['rollouts']} ok  wall {r['wall_s']:.1f}s"
            f"  {r['rollouts_per_s']:.1f} rollouts/s (steady {_fmt(r['steady_rollouts_per_s'])})"
            f"  peak RSS {r['peak_rss_gib']:.2f} GiB"
        )
    print(
        f"  -> vfray/verifiers rollouts/s {_fmt(row['ratio_rollouts_per_s'], '.1f')}x"
        f" (steady {_fmt(row['ratio_steady'], '.1f')}x), peak RSS"
        f" {_fmt(row['ratio_peak_rss'], '.2f')}x",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=200, help="vfray's tasks")
    parser.add_argument("--vf-tasks", type=int, default=200, help="verifiers' tasks")
    parser.add_argument("-r", "--rollouts", type=int, default=4)
    parser.add_argument("-c", "--concurrency", type=int, nargs="+", default=[32, 256])
    parser.add_argument("--latency", type=float, nargs="+", default=[0.0, 1.0])
    parser.add_argument("--timeout", type=float, default=1800.0, help="per command")
    parser.add_argument(
        "--max-vf-gib",
        type=float,
        default=None,
        help="skip a verifiers run predicted above this (default: 60%% of free memory)",
    )
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    common.ensure_venv()
    rows = measure(
        args.tasks,
        args.vf_tasks,
        args.rollouts,
        args.concurrency,
        args.latency,
        args.timeout,
        args.max_vf_gib or common.memory_budget_gib(),
    )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
