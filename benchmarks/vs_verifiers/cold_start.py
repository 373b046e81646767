"""Cold start: seconds from launching the eval command to its first finished rollout.

Both sides run the same way: the CLI is launched as a fresh subprocess (``vfray eval`` /
verifiers' ``vf-eval``) on 1 task x 2 rollouts (vfray's arithmetic taskset has a group reward,
so n >= 2) against an already-running scripted model. The first finish is read afterwards from
the run's own traces (vfray: ``ended_at`` in the Parquet traces; verifiers:
``timing.scoring.end`` in ``traces.jsonl``), minus the launch time: exact, and independent of
either side's flush settings. The command's total wall time (start-up, the rollouts, shutdown)
is reported too. Best of ``--repeats``.

    python benchmarks/vs_verifiers/cold_start.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

from benchmarks.vs_verifiers import common


def measure(repeats: int, timeout: float = 600.0) -> dict[str, Any]:
    out: dict[str, Any] = {"repeats": repeats}
    with common.scripted_model(0.0) as url:
        for side in ("vfray", "verifiers"):
            run = common.vfray_eval if side == "vfray" else common.verifiers_eval
            read = common.vfray_finished if side == "vfray" else common.verifiers_finished
            firsts, walls = [], []
            for _ in range(repeats):
                measured = run(url, 1, 2, 2, timeout)
                done = read(measured.out_dir)
                if done.ends:
                    firsts.append(done.ends[0] - measured.launched)
                walls.append(measured.wall)
                common.cleanup(measured)
            out[side] = {
                "first_rollout_s": min(firsts) if firsts else None,
                "all_first_rollout_s": firsts,
                "command_wall_s": min(walls),
            }
    out["ratio_first_rollout"] = common.ratio(
        out["vfray"]["first_rollout_s"], out["verifiers"]["first_rollout_s"]
    )
    return out


def report(out: dict[str, Any]) -> None:
    for side in ("vfray", "verifiers"):
        r = out[side]
        first = r["first_rollout_s"]
        print(
            f"{side:<10} first finished rollout {'-' if first is None else f'{first:.2f}'} s"
            f"   whole command {r['command_wall_s']:.2f} s   (runs: "
            + ", ".join(f"{x:.2f}" for x in r["all_first_rollout_s"])
            + ")"
        )
    ratio = out["ratio_first_rollout"]
    print(f"vfray / verifiers cold start: {'-' if ratio is None else f'{ratio:.2f}x'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    common.ensure_venv()
    out = measure(args.repeats)
    report(out)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
