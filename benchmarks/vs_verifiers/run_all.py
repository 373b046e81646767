"""Run every vfray-vs-verifiers benchmark and write the results table into benchmarks/README.md
(between the ``vs-verifiers results`` markers), with the machine, its load and the versions.

    python benchmarks/vs_verifiers/run_all.py            # the full run (about an hour on 2 cores)
    python benchmarks/vs_verifiers/run_all.py --quick    # small sizes, a few minutes (smoke test)

The verifiers virtualenv (/opt/verifiers-venv, verifiers==0.4.0) is created on first use.
Raw figures go to benchmarks/vs_verifiers/results.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

from benchmarks.vs_verifiers import (
    cold_start,
    common,
    interception_overhead,
    scale,
    throughput,
    trace_io,
)

README = common.ROOT / "benchmarks" / "README.md"
RESULTS = common.HERE / "results.json"
BEGIN, END = "<!-- vs-verifiers results: begin -->", "<!-- vs-verifiers results: end -->"


def _f(value: Any, spec: str = ".1f", suffix: str = "") -> str:
    return "n/a" if value is None else f"{format(value, spec)}{suffix}"


def _goal(value: float | None, target: float, higher: bool) -> str:
    if value is None:
        return "n/a"
    met = value >= target if higher else value <= target
    return "met" if met else "**missed**"


def _row(*cells: str) -> str:
    return "| " + " | ".join(cells) + " |"


def _throughput_rows(rows: list[dict[str, Any]]) -> list[str]:
    lines = []
    for row in rows:
        v, f = row["vfray"], row["verifiers"]
        label = f"rollouts/s (steady), latency {row['latency']:g} s, c={row['concurrency']}"
        if "skipped" in f:
            ours = f"{_f(v['rollouts_per_s'])} ({_f(v['steady_rollouts_per_s'])})"
            lines.append(_row(label, ours, f"not run: {f['skipped']}", "n/a", ">= 10x: n/a"))
            continue
        lines.append(
            _row(
                label,
                f"{_f(v['rollouts_per_s'])} ({_f(v['steady_rollouts_per_s'])})",
                f"{_f(f['rollouts_per_s'])} ({_f(f['steady_rollouts_per_s'])})",
                f"{_f(row['ratio_rollouts_per_s'], '.1f', 'x')}"
                f" ({_f(row['ratio_steady'], '.1f', 'x')})",
                f">= 10x: {_goal(row['ratio_rollouts_per_s'], 10, True)}",
            )
        )
    for row in rows:
        v, f = row["vfray"], row["verifiers"]
        big = row["concurrency"] >= 256
        theirs = (
            f"~{f['predicted_peak_rss_gib']:.1f} (predicted from c=32, not run)"
            if "skipped" in f
            else _f(f["peak_rss_gib"], ".2f")
        )
        lines.append(
            _row(
                f"peak RSS GiB (whole process tree), latency {row['latency']:g} s,"
                f" c={row['concurrency']}",
                _f(v["peak_rss_gib"], ".2f"),
                theirs,
                _f(row["ratio_peak_rss"], ".2f", "x"),
                f"<= 1/4: {_goal(row['ratio_peak_rss'], 0.25, False)}" if big else "",
            )
        )
    return lines


def table(results: dict[str, Any]) -> str:
    lines = [
        f"Measured {results['date']} on {results['machine_before']}"
        f" (after the run: {results.get('machine_after', 'not recorded')}).",
        f"Versions: {', '.join(f'{k} {v}' for k, v in results['versions'].items())}."
        f" Sizes: {results['sizes']}.",
        "",
        _row("measure", "vfray", "verifiers v1", "vfray / verifiers", "goal"),
        _row("---", "---", "---", "---", "---"),
    ]
    if "throughput" in results:
        lines += _throughput_rows(results["throughput"])
    if "cold_start" in results:
        cs = results["cold_start"]
        lines.append(
            _row(
                "cold start: launch to first finished rollout, s",
                _f(cs["vfray"]["first_rollout_s"], ".1f"),
                _f(cs["verifiers"]["first_rollout_s"], ".1f"),
                _f(cs["ratio_first_rollout"], ".2f", "x"),
                f"<= 1/4: {_goal(cs['ratio_first_rollout'], 0.25, False)}",
            )
        )
    if "interception" in results:
        ic = results["interception"]
        n = ic["sessions"]
        for key, label in (("added_p50_ms", "p50"), ("added_p99_ms", "p99")):
            r = ic[f"ratio_added_{label}"]
            lines.append(
                _row(
                    f"interception: added {label} ms at {n['latency']} sessions"
                    f" (bare aiohttp proxy {ic['bare-aiohttp'][key]:.1f})",
                    f"{ic['vfray'][key]:.1f}",
                    f"{ic['verifiers'][key]:.1f}",
                    _f(r, ".2f", "x"),
                    f"<= 1/6: {_goal(r, 1 / 6, False)}",
                )
            )
        lines.append(
            _row(
                f"interception: turns/s at {n['rate']} sessions"
                f" (bare aiohttp proxy {ic['bare-aiohttp']['turns_s']:.0f})",
                f"{ic['vfray']['turns_s']:.0f}",
                f"{ic['verifiers']['turns_s']:.0f}",
                _f(ic["ratio_turns_s"], ".1f", "x"),
                f">= 10x: {_goal(ic['ratio_turns_s'], 10, True)}",
            )
        )
    if "scale" in results:
        sc = results["scale"]
        v, f = sc["vfray"], sc["verifiers"]
        lines.append(
            _row(
                f"scale: most sessions held with 0 errors (levels {sc['levels']})",
                f"{v['held']} ({v['stopped']})",
                f"{f['held']} ({f['stopped']})",
                "",
                "",
            )
        )
        lines.append(
            _row(
                "scale: MiB per in-flight rollout at that level",
                _f(v["mib_per_rollout"], ".0f"),
                _f(f["mib_per_rollout"], ".0f"),
                _f(sc["ratio_mib_per_rollout"], ".2f", "x"),
                "",
            )
        )
    if "trace_io" in results:
        tio = results["trace_io"]
        v, f = tio["vfray"], tio["verifiers"]
        for label, a, b, key in (
            (
                f"trace IO: read {v['traces']} traces as typed objects, s",
                "read_typed_s",
                "read_typed_s",
                "ratio_read_typed",
            ),
            (
                "trace IO: read raw (Arrow table / json.loads), s",
                "read_table_s",
                "read_json_s",
                "ratio_read_raw",
            ),
            ("trace IO: write, s", "write_s", "write_s", "ratio_write"),
        ):
            speed = _f(tio[key], ".1f", "x faster")
            lines.append(_row(label, f"{v[a]:.3f}", f"{f[b]:.3f}", speed, ""))
        lines.append(
            _row(
                "trace IO: bytes per trace on disk",
                f"{v['bytes_per_trace']:.0f}",
                f"{f['bytes_per_trace']:.0f}",
                _f(tio["ratio_bytes"], ".2f", "x"),
                "",
            )
        )
    return "\n".join(lines)


def write_readme(results: dict[str, Any]) -> None:
    text = README.read_text() if README.exists() else f"{BEGIN}\n{END}\n"
    block = f"{BEGIN}\n{table(results)}\n{END}"
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else f"{text}\n{block}\n"
    README.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
    parser.add_argument("--vf-tasks", type=int, help="verifiers' tasks in the throughput runs")
    parser.add_argument("--levels", type=int, nargs="+", help="scale levels (sessions)")
    parser.add_argument("--repeats", type=int, help="cold-start repeats")
    parser.add_argument("--seconds", type=float, help="interception seconds per row")
    parser.add_argument("--only", nargs="+", help="run only these parts (others from results.json)")
    args = parser.parse_args()
    common.ensure_venv()
    results: dict[str, Any] = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    results["date"] = datetime.date.today().isoformat()
    results["machine_before"] = common.load_summary()
    results["versions"] = common.versions()
    if args.quick:
        tasks, vf_tasks, levels, seconds, repeats = 16, 4, [32, 64], 2.0, 1
    else:
        tasks, vf_tasks, levels, seconds, repeats = 200, 200, [64, 128, 256, 512, 1024], 8.0, 3
    vf_tasks = args.vf_tasks or vf_tasks
    levels = args.levels or levels
    repeats = args.repeats or repeats
    seconds = args.seconds or seconds
    results["sizes"] = (
        f"throughput vfray {tasks} x 4, verifiers {vf_tasks} x 4; scale levels {levels};"
        f" interception {seconds:g} s per row; cold start best of {repeats}"
    )
    parts: dict[str, Callable[[], Any]] = {
        "interception": lambda: interception_overhead.measure(seconds),
        "cold_start": lambda: cold_start.measure(repeats),
        "trace_io": lambda: trace_io.measure(tasks, min(vf_tasks, 25)),
        "throughput": lambda: throughput.measure(
            tasks, vf_tasks, 4, [32, 256], [0.0, 1.0], 3600.0, common.memory_budget_gib()
        ),
        "scale": lambda: scale.measure(levels, 5.0, common.memory_budget_gib(), 900.0),
    }
    for name, run in parts.items():
        if args.only and name not in args.only:
            continue
        print(f"== {name}", flush=True)
        results[name] = run()
        RESULTS.write_text(json.dumps(results, indent=2, default=str))
    results["machine_after"] = common.load_summary()
    RESULTS.write_text(json.dumps(results, indent=2, default=str))
    write_readme(results)
    print(table(results))


if __name__ == "__main__":
    main()
