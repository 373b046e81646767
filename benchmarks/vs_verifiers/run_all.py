"""Run every vfray-vs-verifiers benchmark and write the results table into benchmarks/README.md
(between the ``vs-verifiers results`` markers), with the machine, its load and the versions.

    python benchmarks/vs_verifiers/run_all.py            # full sizes (well over an hour on 2 cores)
    python benchmarks/vs_verifiers/run_all.py --quick    # small sizes, a few minutes (smoke test)
    python benchmarks/vs_verifiers/run_all.py --only cold_start --sides vfray-local
    python benchmarks/vs_verifiers/run_all.py --quick --results /tmp/r.json --readme /tmp/R.md

Three sides: ``vfray`` (``vfray eval --backend ray``), ``vfray-local`` (``--backend local``: one
process, no Ray) and ``verifiers``; ``--sides`` picks some (a part re-run for some sides keeps
the other sides' figures from the results file). The verifiers virtualenv
(/opt/verifiers-venv, verifiers==0.4.0) is created on first use. Raw figures go to
benchmarks/vs_verifiers/results.json (``--results``); the table to benchmarks/README.md
(``--readme``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
import time
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


RAY, LOCAL, VF = "vfray", "vfray-local", "verifiers"
HEADER = (
    "measure",
    "vfray (Ray)",
    "vfray (local)",
    "verifiers v1",
    "Ray / verifiers",
    "local / verifiers",
    "goal",
)
BACKEND_NAME = {RAY: "Ray", LOCAL: "local"}


def _f(value: Any, spec: str = ".1f", suffix: str = "") -> str:
    return "n/a" if value is None else f"{format(value, spec)}{suffix}"


def _goal(value: float | None, target: float, higher: bool) -> str:
    if value is None:
        return "n/a"
    met = value >= target if higher else value <= target
    return "met" if met else "**missed**"


def _goals(label: str, ratios: dict[str, float | None], target: float, higher: bool) -> str:
    """The goal cell for a row with one ratio per vfray backend, naming which backend meets it:
    ``<= 1/4: met (local); **missed** (Ray)``, or ``met (Ray, local)`` when both agree."""
    status = {side: _goal(r, target, higher) for side, r in ratios.items() if r is not None}
    if not status:
        return f"{label}: n/a"
    if len(set(status.values())) == 1:
        names = ", ".join(BACKEND_NAME[side] for side in status)
        return f"{label}: {next(iter(status.values()))} ({names})"
    met = [BACKEND_NAME[side] for side, st in status.items() if st == "met"]
    missed = [BACKEND_NAME[side] for side, st in status.items() if st != "met"]
    return f"{label}: met ({', '.join(met)}); **missed** ({', '.join(missed)})"


def _row(*cells: str) -> str:
    return "| " + " | ".join(cells) + " |"


def _rate(side: dict[str, Any] | None) -> str:
    """``end-to-end (steady)`` rollouts/s of one side's throughput run."""
    if side is None:
        return "n/a"
    if "skipped" in side:
        return f"not run: {side['skipped']}"
    return f"{_f(side.get('rollouts_per_s'))} ({_f(side.get('steady_rollouts_per_s'))})"


def _throughput_rows(rows: list[dict[str, Any]]) -> list[str]:
    lines = []
    for row in rows:
        label = f"rollouts/s (steady), latency {row['latency']:g} s, c={row['concurrency']}"
        ratios = {side: row.get(common.ratio_key("rollouts_per_s", side)) for side in (RAY, LOCAL)}
        ratio_cells = [
            f"{_f(ratios[side], '.1f', 'x')}"
            f" ({_f(row.get(common.ratio_key('steady', side)), '.1f', 'x')})"
            if ratios[side] is not None
            else "n/a"
            for side in (RAY, LOCAL)
        ]
        lines.append(
            _row(
                label,
                _rate(row.get(RAY)),
                _rate(row.get(LOCAL)),
                _rate(row.get(VF)),
                *ratio_cells,
                _goals(">= 10x", ratios, 10, True),
            )
        )
    for row in rows:
        f = row.get(VF)
        big = row["concurrency"] >= 256
        if f is None:
            theirs = "n/a"
        elif "skipped" in f:
            theirs = f"~{f['predicted_peak_rss_gib']:.1f} (predicted from c=32, not run)"
        else:
            theirs = _f(f.get("peak_rss_gib"), ".2f")
        ratios = {side: row.get(common.ratio_key("peak_rss", side)) for side in (RAY, LOCAL)}
        lines.append(
            _row(
                f"peak RSS GiB (whole process tree), latency {row['latency']:g} s,"
                f" c={row['concurrency']}",
                _f((row.get(RAY) or {}).get("peak_rss_gib"), ".2f"),
                _f((row.get(LOCAL) or {}).get("peak_rss_gib"), ".2f"),
                theirs,
                _f(ratios[RAY], ".2f", "x"),
                _f(ratios[LOCAL], ".2f", "x"),
                _goals("<= 1/4", ratios, 0.25, False) if big else "",
            )
        )
    return lines


def _cold_start_rows(cs: dict[str, Any]) -> list[str]:
    ratios = {side: cs.get(common.ratio_key("first_rollout", side)) for side in (RAY, LOCAL)}
    first = {side: (cs.get(side) or {}).get("first_rollout_s") for side in (RAY, LOCAL, VF)}
    return [
        _row(
            "cold start: launch to first finished rollout, s",
            _f(first[RAY], ".1f"),
            _f(first[LOCAL], ".1f"),
            _f(first[VF], ".1f"),
            _f(ratios[RAY], ".2f", "x"),
            _f(ratios[LOCAL], ".2f", "x"),
            _goals("<= 1/4", ratios, 0.25, False),
        )
    ]


def _interception_rows(ic: dict[str, Any]) -> list[str]:
    # The interception app is the same in both backends and measured on its own: its figure
    # stands in the Ray column, "same" under local.
    n = ic["sessions"]
    lines = []
    for key, label in (("added_p50_ms", "p50"), ("added_p99_ms", "p99")):
        r = ic[f"ratio_added_{label}"]
        lines.append(
            _row(
                f"interception: added {label} ms at {n['latency']} sessions"
                f" (bare aiohttp proxy {ic['bare-aiohttp'][key]:.1f})",
                f"{ic['vfray'][key]:.1f}",
                "same",
                f"{ic['verifiers'][key]:.1f}",
                _f(r, ".2f", "x"),
                "same",
                f"<= 1/6: {_goal(r, 1 / 6, False)}",
            )
        )
    lines.append(
        _row(
            f"interception: turns/s at {n['rate']} sessions"
            f" (bare aiohttp proxy {ic['bare-aiohttp']['turns_s']:.0f})",
            f"{ic['vfray']['turns_s']:.0f}",
            "same",
            f"{ic['verifiers']['turns_s']:.0f}",
            _f(ic["ratio_turns_s"], ".1f", "x"),
            "same",
            f">= 10x: {_goal(ic['ratio_turns_s'], 10, True)}",
        )
    )
    return lines


def _scale_rows(sc: dict[str, Any]) -> list[str]:
    def held(side: str) -> str:
        r = sc.get(side)
        return "n/a" if r is None else f"{r['held']} ({r['stopped']})"

    def per(side: str) -> str:
        return _f((sc.get(side) or {}).get("mib_per_rollout"), ".0f")

    return [
        _row(
            f"scale: most sessions held with 0 errors (levels {sc['levels']})",
            held(RAY),
            held(LOCAL),
            held(VF),
            "",
            "",
            "",
        ),
        _row(
            "scale: MiB per in-flight rollout at that level",
            per(RAY),
            per(LOCAL),
            per(VF),
            _f(sc.get(common.ratio_key("mib_per_rollout", RAY)), ".2f", "x"),
            _f(sc.get(common.ratio_key("mib_per_rollout", LOCAL)), ".2f", "x"),
            "",
        ),
    ]


def _trace_io_rows(tio: dict[str, Any]) -> list[str]:
    # Read from the traces of a Ray-backend run (its TraceSink's parts); not measured on a
    # local run's folder, hence n/a under local.
    v, f = tio["vfray"], tio["verifiers"]
    lines = []
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
        lines.append(_row(label, f"{v[a]:.3f}", "n/a", f"{f[b]:.3f}", speed, "n/a", ""))
    lines.append(
        _row(
            "trace IO: bytes per trace on disk",
            f"{v['bytes_per_trace']:.0f}",
            "n/a",
            f"{f['bytes_per_trace']:.0f}",
            _f(tio["ratio_bytes"], ".2f", "x"),
            "n/a",
            "",
        )
    )
    return lines


def table(results: dict[str, Any]) -> str:
    lines = [
        f"Measured {results['date']} on {results['machine_before']}"
        f" (after the run: {results.get('machine_after', 'not recorded')}).",
        f"Versions: {', '.join(f'{k} {v}' for k, v in results['versions'].items())}."
        f" Sizes: {results['sizes']}.",
        "vfray (Ray): `vfray eval --backend ray` (a local Ray started by the command);"
        " vfray (local): `vfray eval --backend local` (one process, no Ray). The interception"
        ' and trace-IO rows have no backend: the interception app is the same in both ("same"),'
        " trace IO reads a Ray run's traces (n/a under local).",
        "",
        _row(*HEADER),
        _row(*["---"] * len(HEADER)),
    ]
    if "throughput" in results:
        lines += _throughput_rows(results["throughput"])
    if "cold_start" in results:
        lines += _cold_start_rows(results["cold_start"])
    if "interception" in results:
        lines += _interception_rows(results["interception"])
    if "scale" in results:
        lines += _scale_rows(results["scale"])
    if "trace_io" in results:
        lines += _trace_io_rows(results["trace_io"])
    return "\n".join(lines)


def merge_sides(name: str, old: Any, new: Any, sides: list[str]) -> Any:
    """A part re-run for some sides only keeps the other sides' figures from ``old`` (an
    earlier results.json), then recomputes the ratios."""
    kept = [side for side in common.SIDES if side not in sides]
    if old is None or not kept or name not in ("cold_start", "throughput", "scale"):
        return new
    if name == "throughput":
        earlier = {(r["latency"], r["concurrency"]): r for r in old}
        for row in new:
            before = earlier.get((row["latency"], row["concurrency"]), {})
            row.update({side: before[side] for side in kept if side in before})
            throughput.add_ratios(row)
        return new
    new.update({side: old[side] for side in kept if side in old})
    if name == "scale":  # the table names the levels any side climbed
        new["levels"] = sorted(set(new["levels"]) | set(old.get("levels", [])))
    (cold_start if name == "cold_start" else scale).add_ratios(new)
    return new


def write_readme(results: dict[str, Any], readme: Path = README) -> None:
    text = readme.read_text() if readme.exists() else f"{BEGIN}\n{END}\n"
    block = f"{BEGIN}\n{table(results)}\n{END}"
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else f"{text}\n{block}\n"
    readme.write_text(text)


PARTS = ("interception", "cold_start", "trace_io", "throughput", "scale")
_SIZE_PREFIX = {
    "throughput": "throughput",
    "scale": "scale",
    "interception": "interception",
    "cold_start": "cold start",
    "trace_io": "trace IO",
}


def _legacy_sizes(results: dict[str, Any]) -> dict[str, str]:
    """Per-part sizes recovered from an older results.json's one ``sizes`` line."""
    out: dict[str, str] = {}
    for piece in str(results.get("sizes", "")).split("; "):
        for name, prefix in _SIZE_PREFIX.items():
            if piece.startswith(prefix):
                out[name] = piece
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
    parser.add_argument("--tasks", type=int, help="vfray's tasks in the throughput runs")
    parser.add_argument("--vf-tasks", type=int, help="verifiers' tasks in the throughput runs")
    parser.add_argument("--levels", type=int, nargs="+", help="scale levels (sessions)")
    parser.add_argument("--repeats", type=int, help="cold-start repeats")
    parser.add_argument("--seconds", type=float, help="interception seconds per row")
    parser.add_argument(
        "--only", nargs="+", choices=PARTS, help="run only these parts (others from results.json)"
    )
    common.sides_arg(parser)
    parser.add_argument(
        "--results", type=Path, default=RESULTS, help="results file read and rewritten"
    )
    parser.add_argument(
        "--readme", type=Path, default=README, help="file whose marked block gets the table"
    )
    args = parser.parse_args()
    sides = common.ordered(args.sides)
    common.ensure_venv()
    results: dict[str, Any] = json.loads(args.results.read_text()) if args.results.exists() else {}
    results["date"] = datetime.date.today().isoformat()
    results["machine_before"] = common.load_summary()
    results["versions"] = common.versions()
    if args.quick:
        tasks, vf_tasks, levels, seconds, repeats = 16, 4, [32, 64], 2.0, 1
    else:
        tasks, vf_tasks, levels, seconds, repeats = 200, 200, [64, 128, 256, 512, 1024], 8.0, 3
    tasks = args.tasks or tasks
    vf_tasks = args.vf_tasks or vf_tasks
    levels = args.levels or levels
    repeats = args.repeats or repeats
    seconds = args.seconds or seconds
    # Each part's sizes are kept with it, so a table merged from several runs (--only) names
    # the sizes each row was measured at.
    sizes: dict[str, str] = {
        "throughput": f"throughput vfray {tasks} x 4 (each backend), verifiers {vf_tasks} x 4",
        "scale": f"scale levels {levels}",
        "interception": f"interception {seconds:g} s per row",
        "cold_start": f"cold start best of {repeats}",
        "trace_io": f"trace IO vfray {tasks} x 4, verifiers {min(vf_tasks, 25)} x 4",
    }
    parts: dict[str, Callable[[], Any]] = {
        "interception": lambda: interception_overhead.measure(seconds),
        "cold_start": lambda: cold_start.measure(repeats, sides=sides),
        "trace_io": lambda: trace_io.measure(tasks, min(vf_tasks, 25)),
        "throughput": lambda: throughput.measure(
            tasks, vf_tasks, 4, [32, 256], [0.0, 1.0], 3600.0, common.memory_budget_gib(), sides
        ),
        "scale": lambda: scale.measure(levels, 5.0, common.memory_budget_gib(), 900.0, sides),
    }
    part_sizes: dict[str, str] = results.setdefault("part_sizes", _legacy_sizes(results))
    for name, run in parts.items():
        if args.only and name not in args.only:
            continue
        print(f"== {name}", flush=True)
        started = time.perf_counter()
        results[name] = merge_sides(name, results.get(name), run(), sides)
        part_sizes[name] = sizes[name]
        print(f"== {name} took {time.perf_counter() - started:.0f} s", flush=True)
        args.results.write_text(json.dumps(results, indent=2, default=str))
    if "scale" in results:  # the levels a scale run climbed are stored with it
        part_sizes["scale"] = f"scale levels {results['scale']['levels']}"
    results["sizes"] = "; ".join(
        part_sizes[name] for name in PARTS if name in results and name in part_sizes
    )
    results["machine_after"] = common.load_summary()
    args.results.write_text(json.dumps(results, indent=2, default=str))
    write_readme(results, args.readme)
    print(table(results))


if __name__ == "__main__":
    main()
