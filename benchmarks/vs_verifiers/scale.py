"""Scale: the most concurrent rollouts each framework holds with zero errors, and its memory per
in-flight rollout (peak RSS of the whole process tree / sessions in flight).

Each level runs C tasks x 2 rollouts at max concurrency C against a scripted model that sleeps
``--latency`` seconds per call, so all C sessions are open at once. Levels double until a level
has errors, the time box runs out, or the next level's memory (predicted from the last one)
would exceed ``--max-gib`` (the machine is shared; the prediction is reported instead).

    python benchmarks/vs_verifiers/scale.py [--levels 64 128 256 512 1024]
"""

from __future__ import annotations

import argparse
import json
import sys
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
    run = common.vfray_eval if side == "vfray" else common.verifiers_eval
    read = common.vfray_finished if side == "vfray" else common.verifiers_finished
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
            measured = run(url, c // 2, 2, c, timeout)
        done = read(measured.out_dir)
        step = {
            "concurrency": c,
            "ok": done.ok,
            "errors": c - done.ok,
            "wall_s": measured.wall,
            "peak_gib": common.gib(measured.peak_rss),
            "mib_per_rollout": common.gib(measured.peak_rss) * 1024 / c,
        }
        common.cleanup(measured)
        steps.append(step)
        print(
            f"  {side:<10} {c:>5} sessions: {done.ok}/{c} ok in {measured.wall:.0f}s,"
            f" peak {step['peak_gib']:.2f} GiB = {step['mib_per_rollout']:.0f} MiB/rollout",
            flush=True,
        )
        if step["errors"]:
            stopped = f"errors at {c} sessions"
            break
        held, previous = c, step
    best = next((s for s in steps if s["concurrency"] == held), None)
    return {
        "held": held,
        "stopped": stopped,
        "mib_per_rollout": best["mib_per_rollout"] if best else None,
        "steps": steps,
    }


def measure(levels: list[int], latency: float, max_gib: float, timeout: float) -> dict[str, Any]:
    out: dict[str, Any] = {"latency": latency, "levels": levels}
    for side in ("vfray", "verifiers"):
        out[side] = climb(side, levels, latency, max_gib, timeout)
    out["ratio_mib_per_rollout"] = common.ratio(
        out["vfray"]["mib_per_rollout"], out["verifiers"]["mib_per_rollout"]
    )
    return out


def report(out: dict[str, Any]) -> None:
    for side in ("vfray", "verifiers"):
        r = out[side]
        per = r["mib_per_rollout"]
        print(
            f"{side:<10} held {r['held']} sessions with 0 errors ({r['stopped']});"
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
    args = parser.parse_args()
    common.ensure_venv()
    out = measure(
        args.levels, args.latency, args.max_gib or common.memory_budget_gib(), args.timeout
    )
    report(out)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
