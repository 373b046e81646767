"""Scale: the most concurrent rollouts each framework holds with zero errors, and its memory per
in-flight rollout (peak RSS of the whole process tree / sessions in flight).

Each level runs C tasks x 2 rollouts at max concurrency C against a scripted model that sleeps
``--latency`` seconds per call, so all C sessions are open at once. Levels double until a level
has errors, the time box runs out, or the next level's memory (predicted from the last one)
would exceed ``--max-gib`` (the machine is shared; the prediction is reported instead).

Sides: ``vfray eval --backend ray``, ``vfray eval --backend local`` and verifiers' ``vf-eval``.

    python benchmarks/vs_verifiers/scale.py [--levels 64 128 256 512 1024]
    python benchmarks/vs_verifiers/scale.py --levels 64 256 --sides vfray-local verifiers
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


def _predict(steps: list[dict[str, Any]], c: int) -> float:
    """Peak GiB at ``c`` sessions: a line through the last two levels (a fixed part plus a
    per-session slope), or proportional to the only level measured so far."""
    last = steps[-1]
    if len(steps) < 2:
        return float(last["peak_gib"] * c / last["concurrency"])
    first = steps[-2]
    slope = (last["peak_gib"] - first["peak_gib"]) / (last["concurrency"] - first["concurrency"])
    return float(last["peak_gib"] + max(slope, 0.0) * (c - last["concurrency"]))


def climb(
    side: str, levels: list[int], latency: float, max_gib: float, timeout: float
) -> dict[str, Any]:
    steps: list[dict[str, Any]] = []
    held = 0
    stopped = "all levels passed"
    previous: dict[str, Any] | None = None
    for c in levels:
        if previous is not None:
            need = _predict(steps, c)
            if need > max_gib:
                stopped = f"memory guard: {c} sessions would need ~{need:.1f} GiB"
                break
        with common.scripted_model(latency) as url:
            measured, done = common.run_side(side, url, c // 2, 2, c, timeout)
        step = {
            "concurrency": c,
            "ok": done.ok,
            "errors": c - done.ok,
            "wall_s": measured.wall,
            "peak_gib": common.gib(measured.peak_rss),
            "mib_per_rollout": common.gib(measured.peak_rss) * 1024 / c,
        }
        if measured.returncode != 0 or step["errors"]:
            step["returncode"] = measured.returncode
            step["stderr_tail"] = measured.stderr_tail[-800:]
        common.cleanup(measured)
        steps.append(step)
        print(
            f"  {common.LABEL[side]:<14} {c:>5} sessions: {done.ok}/{c} ok in {measured.wall:.0f}s,"
            f" peak {step['peak_gib']:.2f} GiB = {step['mib_per_rollout']:.0f} MiB/rollout",
            flush=True,
        )
        if step["errors"]:
            stopped = f"errors at {c} sessions"
            if measured.returncode != 0:  # the command itself failed (e.g. Ray did not start)
                lines = [line for line in measured.stderr_tail.splitlines() if line.strip()]
                last = lines[-1].strip().replace("|", "/") if lines else ""
                stopped += f", exit {measured.returncode}: {last[:100]}"
            break
        held, previous = c, step
    best = next((s for s in steps if s["concurrency"] == held), None)
    return {
        "held": held,
        "stopped": stopped,
        "mib_per_rollout": best["mib_per_rollout"] if best else None,
        "steps": steps,
    }


def measure(
    levels: list[int],
    latency: float,
    max_gib: float,
    timeout: float,
    sides: Iterable[str] = common.SIDES,
) -> dict[str, Any]:
    out: dict[str, Any] = {"latency": latency, "levels": levels}
    for side in common.ordered(sides):
        out[side] = climb(side, levels, latency, max_gib, timeout)
    add_ratios(out)
    return out


def add_ratios(out: dict[str, Any]) -> None:
    """(Re)compute each vfray side's MiB-per-rollout ratio against verifiers from the sides
    present (None where either is missing)."""
    theirs = out.get("verifiers", {}).get("mib_per_rollout")
    for side in common.VFRAY_SIDES:
        ours = out.get(side, {}).get("mib_per_rollout")
        out[common.ratio_key("mib_per_rollout", side)] = common.ratio(ours, theirs)


def report(out: dict[str, Any]) -> None:
    for side in common.SIDES:
        if side not in out:
            continue
        r = out[side]
        per = r["mib_per_rollout"]
        print(
            f"{common.LABEL[side]:<14} held {r['held']} sessions with 0 errors ({r['stopped']});"
            f" {'-' if per is None else f'{per:.0f}'} MiB per in-flight rollout there"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", type=int, nargs="+", default=[64, 128, 256, 512, 1024])
    parser.add_argument("--latency", type=float, default=5.0, help="model seconds per call")
    parser.add_argument(
        "--max-gib", type=float, default=None, help="memory guard (default: 60%% of free memory)"
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="per level")
    parser.add_argument("--json", type=Path)
    common.sides_arg(parser)
    args = parser.parse_args()
    if "verifiers" in args.sides:
        common.ensure_venv()
    budget = args.max_gib or common.memory_budget_gib()
    out = measure(args.levels, args.latency, budget, args.timeout, args.sides)
    report(out)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
