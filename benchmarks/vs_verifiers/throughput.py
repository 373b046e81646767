"""Throughput: the arithmetic taskset (N tasks x 4 rollouts), the tool-less chat harness, the local
subprocess runtime and one shared scripted model, run by ``vfray eval --backend ray``, ``vfray
eval --backend local`` and verifiers' ``vf-eval``; rollouts/s (end to end, and over the run
phase: first rollout start to last rollout end) and peak memory of each, and the ratios of
each vfray backend against verifiers.

    python benchmarks/vs_verifiers/throughput.py                      # 200 x 4, c=32,256, 0 s,1 s
    python benchmarks/vs_verifiers/throughput.py --tasks 20 --vf-tasks 8 --latency 0 -c 32
    python benchmarks/vs_verifiers/throughput.py --sides vfray-local verifiers
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

from benchmarks.vs_verifiers import common


def one_side(
    side: str, url: str, tasks: int, rollouts: int, c: int, timeout: float
) -> dict[str, Any]:
    measured, done = common.run_side(side, url, tasks, rollouts, c, timeout)
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
    sides: Iterable[str] = common.SIDES,
) -> list[dict[str, Any]]:
    """One row per (latency, concurrency): each side's figures (keyed by side name) and each
    vfray side's ratios against verifiers."""
    chosen = common.ordered(sides)
    rows = []
    vf_per_rollout_gib: float | None = None
    for latency in latencies:
        for c in sorted(concurrencies):
            row: dict[str, Any] = {"latency": latency, "concurrency": c}
            with common.scripted_model(latency) as url:
                for side in chosen:
                    if side != "verifiers":
                        row[side] = one_side(side, url, tasks, rollouts, c, timeout)
                        continue
                    need = None if vf_per_rollout_gib is None else vf_per_rollout_gib * c
                    if need is not None and need > max_vf_gib:
                        row[side] = {
                            "side": side,
                            "skipped": f"would need ~{need:.1f} GiB"
                            f" (> {max_vf_gib:.1f} GiB allowed)",
                            "predicted_peak_rss_gib": need,
                        }
                        continue
                    theirs = one_side(side, url, vf_tasks, rollouts, c, timeout)
                    row[side] = theirs
                    in_flight = min(c, vf_tasks * rollouts)
                    per = theirs["peak_rss_gib"] / in_flight
                    vf_per_rollout_gib = max(vf_per_rollout_gib or 0.0, per)
            add_ratios(row)
            rows.append(row)
            print_row(row)
    return rows


def add_ratios(row: dict[str, Any]) -> None:
    """(Re)compute each vfray side's ratios against verifiers in ``row`` from the sides present
    (None where either is missing). A skipped verifiers run is compared by its predicted peak
    memory (the table flags it)."""
    theirs = row.get("verifiers", {})
    their_peak = theirs.get("peak_rss_gib", theirs.get("predicted_peak_rss_gib"))
    for side in common.VFRAY_SIDES:
        ours = row.get(side, {})
        row[common.ratio_key("rollouts_per_s", side)] = common.ratio(
            ours.get("rollouts_per_s"), theirs.get("rollouts_per_s")
        )
        row[common.ratio_key("steady", side)] = common.ratio(
            ours.get("steady_rollouts_per_s"), theirs.get("steady_rollouts_per_s")
        )
        row[common.ratio_key("peak_rss", side)] = common.ratio(ours.get("peak_rss_gib"), their_peak)


def _fmt(value: Any, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def print_row(row: dict[str, Any]) -> None:
    where = f"  latency {row['latency']:g}s c={row['concurrency']:<4}"
    for side in common.SIDES:
        r = row.get(side)
        if r is None:
            continue
        if "skipped" in r:
            print(f"{where} {common.LABEL[side]:<14} {r['skipped']}")
            continue
        print(
            f"{where} {common.LABEL[side]:<14}"
            f" {r['ok']}/{r['rollouts']} ok  wall {r['wall_s']:.1f}s"
            f"  {r['rollouts_per_s']:.1f} rollouts/s (steady {_fmt(r['steady_rollouts_per_s'])})"
            f"  peak RSS {r['peak_rss_gib']:.2f} GiB"
        )
    if "verifiers" not in row:
        return
    for side in common.VFRAY_SIDES:
        if side not in row:
            continue
        print(
            f"  -> {common.LABEL[side]} / verifiers rollouts/s"
            f" {_fmt(row[common.ratio_key('rollouts_per_s', side)], '.1f')}x"
            f" (steady {_fmt(row[common.ratio_key('steady', side)], '.1f')}x), peak RSS"
            f" {_fmt(row[common.ratio_key('peak_rss', side)], '.2f')}x",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=200, help="vfray's tasks (either backend)")
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
    common.sides_arg(parser)
    args = parser.parse_args()
    if "verifiers" in args.sides:
        common.ensure_venv()
    rows = measure(
        args.tasks,
        args.vf_tasks,
        args.rollouts,
        args.concurrency,
        args.latency,
        args.timeout,
        args.max_vf_gib or common.memory_budget_gib(),
        args.sides,
    )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
