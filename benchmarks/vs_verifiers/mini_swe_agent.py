"""The same real agent on both frameworks: mini-swe-agent 2.4.6 on a write-a-file taskset (N tasks
x 1 rollout, concurrency C), the subprocess runtime and one shared scripted ``agent`` model, run by
``vfray eval --backend local --harness mini-swe-agent`` and by verifiers' ``vf-eval`` with its
own ``mini_swe_agent`` harness; wall time, rollouts/s over the run phase, peak RSS of each whole
process tree, rewards, and the ratios.

verifiers' ``mini_swe_agent`` declares ``NEEDS_CONTAINER`` and refuses the subprocess runtime;
its side runs through ``vf_side/vf_eval_subprocess_msa.py``, which is verifiers' own ``vf-eval``
with that one class flag turned off, so both sides run the same program on the same runtime type
(verifiers' harness installs mini-swe-agent with ``uv`` into a cached script environment on its
first run; vfray's into its tool dir: both are warmed by a first, unmeasured run).

    python benchmarks/vs_verifiers/mini_swe_agent.py --tasks 8 -c 8
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

from benchmarks.vs_verifiers import common

WRAPPER = common.VF_SIDE / "vf_eval_subprocess_msa.py"
TASKSET = str(Path(__file__).resolve().parent / "write_taskset.py") + ":WriteTaskset"


def vfray_side(url: str, tasks: int, c: int, timeout: float) -> common.Measured:
    out = common.fresh_dir("vfray-msa")
    argv = [sys.executable, "-m", "vfray.cli.main", "eval", TASKSET]
    argv += ["--taskset-args", json.dumps({"num_tasks": tasks})]
    argv += ["-n", str(tasks), "-r", "1", "-c", str(c), "-m", "scripted", "--base-url", url]
    argv += ["--harness", "mini-swe-agent", "--runtime", "subprocess", "--backend", "local"]
    argv += ["--no-progress", "-o", str(out / "outputs")]
    return common.run_measured(argv, {**os.environ}, out, timeout)


def verifiers_side(url: str, tasks: int, c: int, timeout: float) -> common.Measured:
    out = common.fresh_dir("verifiers-msa")
    python = common.ensure_venv()
    argv = [str(python), str(WRAPPER), "vfbench-write", "-m", "scripted"]
    argv += ["--client.base-url", url, "--client.api-key-var", common.API_KEY_VAR]
    argv += ["--env.agent.harness.id", "mini_swe_agent", "--env.agent.runtime.type", "subprocess"]
    argv += ["--env.taskset.num-tasks", str(tasks), "-n", str(tasks), "-r", "1", "-c", str(c)]
    argv += ["--no-push", "--no-rich", "-o", str(out / "outputs")]
    env = {**os.environ, "PYTHONPATH": str(common.VF_SIDE), common.API_KEY_VAR: "unused"}
    # uv (which verifiers' harness runs in the box) is found next to the venv's python.
    env["PATH"] = f"{python.parent}:{env.get('PATH', '')}"
    env.pop("VIRTUAL_ENV", None)
    return common.run_measured(argv, env, out, timeout)


def rewards(side: str, out_dir: Path) -> list[float]:
    if side == "vfray":
        import pyarrow.parquet as pq

        files = sorted(out_dir.glob("outputs/*/*/traces/*.parquet"))
        if not files:
            return []
        table = pq.read_table(files[0].parent, columns=["reward"])
        return [r if r is not None else 0.0 for r in table.column("reward").to_pylist()]
    found = []
    for path in sorted(out_dir.glob("outputs/*/traces.jsonl")):
        for line in path.read_text().splitlines():
            for trace in json.loads(line).get("traces", []):
                score = (trace.get("rewards") or {}).get("wrote_it") or {}
                found.append(float(score.get("score") or 0.0))
    return found


def run(side: str, url: str, tasks: int, c: int, timeout: float) -> dict[str, Any]:
    measure = vfray_side if side == "vfray" else verifiers_side
    measured = measure(url, tasks, c, timeout)
    done = (common.vfray_finished if side == "vfray" else common.verifiers_finished)(
        measured.out_dir
    )
    span = done.ends[-1] - done.first_start if done.ends and done.first_start else 0.0
    scores = rewards(side, measured.out_dir)
    result = {
        "side": side,
        "returncode": measured.returncode,
        "finished": done.total,
        "ok": done.ok,
        "reward_mean": sum(scores) / len(scores) if scores else 0.0,
        "wall_s": measured.wall,
        "steady_per_s": done.total / span if span > 0 else 0.0,
        "peak_rss_mib": measured.peak_rss / 2**20,
        "stderr_tail": measured.stderr_tail[-600:] if measured.returncode else "",
    }
    common.cleanup(measured)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("-c", "--concurrency", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--no-warm", action="store_true", help="skip the unmeasured first runs")
    args = parser.parse_args()
    one, five, fifteen = os.getloadavg()
    print(f"{os.cpu_count()} CPUs, load average {one:.1f} / {five:.1f} / {fifteen:.1f}")
    with common.scripted_model(0.0, policy="agent") as url:
        if not args.no_warm:
            for side in ("vfray", "verifiers"):
                warm = run(side, url, 1, 1, args.timeout)
                print(f"warm-up {side}: {warm['wall_s']:.1f} s, reward {warm['reward_mean']}")
        rows = {
            side: run(side, url, args.tasks, args.concurrency, args.timeout)
            for side in ("vfray", "verifiers")
        }
    for side, row in rows.items():
        print(
            f"{side:<10} {row['finished']}/{args.tasks} finished, {row['ok']} ok, reward mean "
            f"{row['reward_mean']:.2f}; wall {row['wall_s']:.1f} s, steady "
            f"{row['steady_per_s']:.3f} rollouts/s, peak tree RSS {row['peak_rss_mib']:.0f} MiB"
            + (f"\n  exit {row['returncode']}: {row['stderr_tail']}" if row["returncode"] else "")
        )
    mine, theirs = rows["vfray"], rows["verifiers"]
    if theirs["steady_per_s"] and theirs["wall_s"] and theirs["peak_rss_mib"]:
        steady = mine["steady_per_s"] / theirs["steady_per_s"]
        print(
            f"vfray / verifiers: steady rollouts/s x{steady:.2f}, "
            f"wall x{mine['wall_s'] / theirs['wall_s']:.2f}, "
            f"peak RSS x{mine['peak_rss_mib'] / theirs['peak_rss_mib']:.2f}"
        )
    one, five, fifteen = os.getloadavg()
    print(f"load average after: {one:.1f} / {five:.1f} / {fifteen:.1f}")


if __name__ == "__main__":
    main()
