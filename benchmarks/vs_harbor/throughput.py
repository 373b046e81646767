"""Trials per second and CPU per trial: ``harbor run`` (Harbor 0.26.0, its docker environment)
against ``vfray eval harbor:PATH`` on docker, on the same machine, engine and tasks
(benchmarks/vs_harbor/tasks: 10 tasks FROM the offline Debian base image).

    python benchmarks/vs_harbor/throughput.py [--attempts 2] [--concurrent 4] \
        [--agents oracle,codex,claude-code]

Each side runs the 10 tasks ``--attempts`` times (Harbor ``-k``, vfray ``-r``) at
``--concurrent`` trials at once, as a CLI subprocess: wall time from start to exit (its start-up
included), CPU = the CLI's process tree (user+system of every process it started and reaped:
Harbor's ``docker compose`` calls; vfray's own process), and the engine's CPU (dockerd and
containerd, with what they reaped) over the same interval, reported apart. Harbor runs twice: as
it comes (``--delete``: each trial's image removed after it, so the next trial of that task
builds its ``RUN`` layers again) and with ``--no-delete`` (images kept, as vfray's image store
keeps them). One untimed run of each side first builds what both cache. The agents ``codex`` and
``claude-code`` talk to the scripted ``agent`` model (a server in this process for Harbor;
vfray's embedded one, whose CPU is counted against vfray). A private dockerd
(tests/docker_engine.py) is started and stopped here (``--docker-url`` uses a running one).
``--bwrap`` adds vfray on the bwrap runtime, each box's root the task's image unpacked once by
the node's image store (built in the same engine).

Prints one JSON object per measurement and writes them all to ``--out`` (default
benchmarks/vs_harbor/results.json).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from benchmarks.vs_harbor import common  # noqa: E402
from vfray.models.scripted.server import scripted_server  # noqa: E402


def harbor_side(
    harbor: Any, engine: str, agent: str, url: str | None, args: argparse.Namespace, delete: bool
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="vfray-vs-harbor-") as tmp:
        argv = common.harbor_run_argv(
            harbor, common.TASKS, agent, Path(tmp) / "jobs", concurrent=args.concurrent,
            base_url=url, attempts=args.attempts,
        )  # fmt: skip
        if not delete:
            argv.append("--no-delete")
        env = common.harbor_env(harbor, engine, common.docker_config(harbor))
        before = common.engine_cpu(engine)
        run = common.measured_run(argv, env, Path(tmp))
        rewards = common.harbor_rewards(Path(tmp) / "jobs")
    if run.returncode:
        raise RuntimeError(f"harbor run failed: {run.output}")
    values = [r.get("reward", 0.0) if r else None for rs in rewards.values() for r in rs]
    cpu = common.engine_cpu(engine) - before
    return _row("harbor" + ("" if delete else " --no-delete"), agent, run, cpu, values, args)


def vfray_side(engine: str, agent: str, args: argparse.Namespace, runtime: str) -> dict[str, Any]:
    options = json.dumps(
        {"base_url": engine, "build_network": "host"} if runtime == "docker"
        else {"docker_url": engine}
    )  # fmt: skip
    model = "scripted:echo" if agent == "oracle" else "scripted:agent"
    with tempfile.TemporaryDirectory(prefix="vfray-vs-harbor-") as tmp:
        argv = [
            sys.executable, "-m", "vfray", "eval", f"harbor:{common.TASKS}", "--harness", agent,
            "-m", model, "--runtime", runtime, "--env.runtime.options", options,
            "-o", str(Path(tmp) / "out"), "--backend", "local", "-r", str(args.attempts),
            "-c", str(args.concurrent), "--no-progress",
        ]  # fmt: skip
        before = common.engine_cpu(engine)
        run = common.measured_run(argv, None, ROOT)
        values = _vfray_rewards(Path(tmp) / "out") if run.returncode == 0 else []
    if run.returncode:
        raise RuntimeError(f"vfray eval failed: {run.output}")
    return _row(f"vfray {runtime}", agent, run, common.engine_cpu(engine) - before, values, args)


def _vfray_rewards(out: Path) -> list[float | None]:
    from vfray.traces.io import read_traces

    [run] = out.glob("*/*")
    return list(read_traces(run / "traces", columns=["reward"]).column("reward").to_pylist())


def _row(
    side: str,
    agent: str,
    run: common.Measured,
    engine: float,
    rewards: list[float | None],
    args: argparse.Namespace,
) -> dict[str, Any]:
    trials = len(rewards)
    scored = [r for r in rewards if r is not None]
    return {
        "side": side,
        "agent": agent,
        "trials": trials,
        "concurrent": args.concurrent,
        "wall_s": round(run.wall, 2),
        "trials_per_s": round(trials / run.wall, 4),
        "cli_cpu_per_trial_s": round(run.cpu / trials, 3),
        "engine_cpu_per_trial_s": round(engine / trials, 3),
        "mean_reward": round(sum(scored) / len(scored), 4) if scored else None,
        "load_1min": round(psutil.getloadavg()[0], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--attempts", type=int, default=2, help="trials per task per side")
    parser.add_argument("--concurrent", type=int, default=4, help="trials at once per side")
    parser.add_argument("--agents", default="oracle,codex")
    parser.add_argument("--bwrap", action="store_true", help="also vfray on bwrap (image root)")
    parser.add_argument("--docker-url", help="an engine to use (default: start one)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results.json"))
    args = parser.parse_args()
    from docker_engine import docker_engine

    from vfray.runtimes import debian_image

    harbor = common.ensure_harbor()
    rows: list[dict[str, Any]] = []
    runtimes = ["docker", *(["bwrap"] if args.bwrap else [])]
    with contextlib.ExitStack() as stack:
        engine = args.docker_url or stack.enter_context(docker_engine())
        base = debian_image.build(Path("/var/cache/vfray-ci/images"))
        debian_image.import_into_docker(base, engine)
        common.build_bench_image(engine)
        url = stack.enter_context(scripted_server("agent"))
        warm = argparse.Namespace(**{**vars(args), "attempts": 1})
        for runtime in runtimes:  # builds (docker) or unpacks (bwrap) the task images once
            vfray_side(engine, "oracle", warm, runtime)
        for agent in args.agents.split(","):
            model_url = None if agent == "oracle" else url
            # Harbor's task images kept from an untimed run, as vfray's image store keeps its.
            harbor_side(harbor, engine, "oracle", None, warm, delete=False)
            plan: list[tuple[str, Any]] = [("harbor", False), ("harbor", True)]
            plan += [("vfray", r) for r in runtimes]
            for side, how in plan:
                if side == "harbor":
                    row = harbor_side(harbor, engine, agent, model_url, args, delete=how)
                else:
                    row = vfray_side(engine, agent, args, how)
                print(json.dumps(row), flush=True)
                rows.append(row)
    machine = {"cpus": psutil.cpu_count(), "load_1min": psutil.getloadavg()[0]}
    Path(args.out).write_text(json.dumps({"machine": machine, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
