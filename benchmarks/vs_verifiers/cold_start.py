"""Cold start: seconds from launching the eval command to its first finished rollout.

Every side runs the same way: the CLI is launched as a fresh subprocess (``vfray eval
--backend ray``, ``vfray eval --backend local``, verifiers' ``vf-eval``) on 1 task x 2 rollouts
(vfray's arithmetic taskset has a group reward, so n >= 2) against an already-running scripted
model. The first finish is read afterwards from the run's own traces (vfray, either backend:
``ended_at`` in the Parquet traces; verifiers:
``timing.scoring.end`` in ``traces.jsonl``), minus the launch time: exact, and independent of
either side's flush settings. The command's total wall time (start-up, the rollouts, shutdown)
is reported too. Best of ``--repeats``.

    python benchmarks/vs_verifiers/cold_start.py [--repeats 3]
    python benchmarks/vs_verifiers/cold_start.py --sides vfray-local verifiers
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


def measure(
    repeats: int, timeout: float = 600.0, sides: Iterable[str] = common.SIDES
) -> dict[str, Any]:
    out: dict[str, Any] = {"repeats": repeats}
    with common.scripted_model(0.0) as url:
        for side in common.ordered(sides):
            firsts, walls = [], []
            for _ in range(repeats):
                measured, done = common.run_side(side, url, 1, 2, 2, timeout)
                if done.ends:
                    firsts.append(done.ends[0] - measured.launched)
                walls.append(measured.wall)
                common.cleanup(measured)
            out[side] = {
                "first_rollout_s": min(firsts) if firsts else None,
                "all_first_rollout_s": firsts,
                "command_wall_s": min(walls),
            }
    add_ratios(out)
    return out


def add_ratios(out: dict[str, Any]) -> None:
    """(Re)compute each vfray side's first-rollout ratio against verifiers from the sides
    present (None where either is missing)."""
    theirs = out.get("verifiers", {}).get("first_rollout_s")
    for side in common.VFRAY_SIDES:
        ours = out.get(side, {}).get("first_rollout_s")
        out[common.ratio_key("first_rollout", side)] = common.ratio(ours, theirs)


def report(out: dict[str, Any]) -> None:
    for side in common.SIDES:
        if side not in out:
            continue
        r = out[side]
        first = r["first_rollout_s"]
        print(
            f"{common.LABEL[side]:<14} first finished rollout"
            f" {'-' if first is None else f'{first:.2f}'} s"
            f"   whole command {r['command_wall_s']:.2f} s   (runs: "
            + ", ".join(f"{x:.2f}" for x in r["all_first_rollout_s"])
            + ")"
        )
    for side in common.VFRAY_SIDES:
        ratio = out.get(common.ratio_key("first_rollout", side))
        if side in out and "verifiers" in out:
            print(
                f"{common.LABEL[side]} / verifiers cold start:"
                f" {'-' if ratio is None else f'{ratio:.2f}x'}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    common.sides_arg(parser)
    args = parser.parse_args()
    if "verifiers" in args.sides:
        common.ensure_venv()
    out = measure(args.repeats, sides=args.sides)
    report(out)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
