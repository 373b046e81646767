"""Rollout benchmark: rollouts/s for single-turn rollouts (null harness, scripted arithmetic model
at zero latency) per runtime through ``LocalEnvironment``, next to sandbox start+stop p50/p99.

Run: ``python benchmarks/rollouts.py [--rollouts 200 --concurrency 32,256]
[--launch-concurrency N] [--docker-url unix:///path/docker.sock --docker-image IMG]``. Docker is
measured only when an engine URL is given (tests/test_runtime_docker.py shows how to start one by
hand). Peak RSS is the whole process tree's (this process and every harness program), sampled
every 0.25 s while the measured rollouts run.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import resource
import shutil
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any

import psutil
from runtimes import measure

import vfray as vf
from vfray.runtimes.base import Runtime, RuntimeSpec
from vfray.runtimes.registry import make_runtime
from vfray.tasksets.arithmetic import ArithmeticTask, ArithmeticTaskset

PHASES = ("boot", "setup", "agent", "scoring", "teardown")


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def tree_rss(root: psutil.Process) -> int:
    """Resident memory of ``root`` and all its descendants, in bytes."""
    total = 0
    with suppress(psutil.Error):
        for proc in [root, *root.children(recursive=True)]:
            with suppress(psutil.Error):
                total += proc.memory_info().rss
    return total


@contextmanager
def peak_tree_rss() -> Iterator[list[int]]:
    """Sample this process tree's RSS every 0.25 s (in a thread); yields [peak] once done."""
    root, peak, stop = psutil.Process(), [0], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], tree_rss(root))
            stop.wait(0.25)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield peak
    finally:
        stop.set()
        sampler.join()


def cpu_seconds() -> float:
    """CPU time (user + system) of this process and of its reaped children (the programs): per
    rollout it shows the cost of the work whatever else the machine runs."""
    own, children = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def tasks(count: int, image: str | None) -> list[ArithmeticTask]:
    made = list(ArithmeticTaskset(num_tasks=count, max_operand=1000))
    if image is None:
        return made
    return [ArithmeticTask(t.data.model_copy(update={"image": image}), key=t.key) for t in made]


async def rollouts(
    runtime: str,
    options: dict[str, Any],
    count: int,
    concurrency: int,
    image: str | None,
    python: str = "python3",
) -> dict[str, float]:
    """Run ``count`` rollouts (after a small warm-up) with at most ``concurrency`` in flight."""
    gate = asyncio.Semaphore(concurrency)
    env = vf.LocalEnvironment(
        "scripted:arithmetic?latency=0",
        harness="null",
        harness_options={"python": python},
        runtime=runtime,
        runtime_options=options,
    )

    async def one(task: ArithmeticTask) -> tuple[vf.Trace, float]:
        async with gate:
            started = time.perf_counter()
            trace = await env.rollout(task)
            return trace, time.perf_counter() - started

    async with env:
        await asyncio.gather(*(one(t) for t in tasks(min(concurrency, 8), image)))
        with peak_tree_rss() as peak:
            cpu_before = cpu_seconds()
            started = time.perf_counter()
            done = await asyncio.gather(*(one(t) for t in tasks(count, image)))
            elapsed = time.perf_counter() - started
            cpu = cpu_seconds() - cpu_before
    traces = [trace for trace, _ in done]
    failed = [t for t in traces if not t.ok or t.reward != 1.0]
    if failed:
        print(f"  {runtime}: {len(failed)} rollouts failed, e.g. {failed[0].errors}")
    latencies = [seconds * 1000 for _, seconds in done]
    row = {
        "rollouts_per_s": count / elapsed,
        "latency_p50": _pct(latencies, 0.5),
        "latency_p99": _pct(latencies, 0.99),
        "failed": float(len(failed)),
        "peak_rss_mib": peak[0] / 2**20,
        "cpu_ms": cpu * 1000 / count,
    }
    for phase in PHASES:
        spans = [t.timing[phase].duration for t in traces if phase in t.timing]
        row[phase] = statistics.fmean(s for s in spans if s is not None) * 1000
    return row


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rollouts", type=int, default=200)
    parser.add_argument(
        "--concurrency", default="32", help="rollouts in flight; a comma list measures each"
    )
    parser.add_argument(
        "--launch-concurrency",
        type=int,
        default=None,
        help="the runtimes' launch_concurrency option (default: theirs, 8 x CPUs; 0: off)",
    )
    parser.add_argument("--cycles", type=int, default=100, help="start+stop cycles per runtime")
    parser.add_argument("--docker-url", default=None)
    parser.add_argument("--docker-image", default="vfray-test:latest")
    parser.add_argument("--only", default=None, help="comma-separated runtimes to measure")
    parser.add_argument(
        "--python",
        default=os.path.realpath(sys.executable),
        help="interpreter of the harness program in the box (default: this one, resolved; a "
        "pyenv shim such as 'python3' adds ~0.3 s of bash per launch)",
    )
    args = parser.parse_args()

    python_root = os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))
    docker_options = {
        "base_url": args.docker_url,
        "volumes": {"/usr": "/usr", python_root: python_root},
    }
    # runtime -> (options, image, start+stop factory) or the reason it is skipped
    candidates: dict[str, tuple[dict[str, Any], str | None, Callable[[], Runtime]] | str] = {
        "subprocess": ({}, None, lambda: make_runtime("subprocess")),
        "bwrap": ({}, None, lambda: make_runtime("bwrap")) if shutil.which("bwrap") else "no bwrap",
        "docker": (
            (
                docker_options,
                args.docker_image,
                lambda: make_runtime(
                    "docker", RuntimeSpec(image=args.docker_image), **docker_options
                ),
            )
            if args.docker_url
            else "no --docker-url"
        ),
    }
    if args.only:
        wanted = set(args.only.split(","))
        candidates = {k: v for k, v in candidates.items() if k in wanted}

    levels = [int(c) for c in args.concurrency.split(",")]
    launch = (
        {} if args.launch_concurrency is None else {"launch_concurrency": args.launch_concurrency}
    )
    print(
        f"{args.rollouts} single-turn rollouts per runtime, null harness, scripted arithmetic "
        f"model (latency 0), concurrency {args.concurrency}, launch options {launch or 'default'}"
        f", harness python {args.python}\n"
    )
    header = f"{'runtime':<12}{'c':>5}{'rollouts/s':>11}{'lat p50':>10}{'lat p99':>10}"
    header += f"{'peak RSS':>12}{'CPU/rollout':>13}{'box start+stop p50':>20}{'p99':>9}"
    print(header)
    rows: dict[tuple[str, int], dict[str, float]] = {}
    for name, candidate in candidates.items():
        if isinstance(candidate, str):
            print(f"{name:<12}skipped: {candidate}")
            continue
        options, image, factory = candidate
        cycles = min(args.cycles, 20) if name == "docker" else args.cycles
        box = await measure(factory, cycles, runs=1) if cycles else {"p50": 0.0, "p99": 0.0}
        for level in levels:
            row = await rollouts(
                name, {**options, **launch}, args.rollouts, level, image, args.python
            )
            row["box_p50"], row["box_p99"] = box["p50"], box["p99"]
            rows[name, level] = row
            print(
                f"{name:<12}{level:>5}{row['rollouts_per_s']:>11.1f}{row['latency_p50']:>7.0f} ms"
                f"{row['latency_p99']:>7.0f} ms{row['peak_rss_mib']:>8.0f} MiB"
                f"{row['cpu_ms']:>10.0f} ms"
                f"{row['box_p50']:>17.1f} ms{row['box_p99']:>6.1f} ms"
            )

    print("\nmean phase time per rollout (ms, under the load above)")
    print(f"{'runtime':<12}{'c':>5}" + "".join(f"{p:>10}" for p in PHASES))
    for (name, level), row in rows.items():
        print(f"{name:<12}{level:>5}" + "".join(f"{row[p]:>10.1f}" for p in PHASES))
    for level in levels:
        base = rows.get(("subprocess", level))
        if base is None:
            continue
        for (name, other), row in rows.items():
            if name != "subprocess" and other == level:
                speed = row["rollouts_per_s"] / base["rollouts_per_s"]
                print(
                    f"c={level} {name} vs subprocess: rollouts/s x{speed:.2f}, "
                    f"box start+stop p50 x{row['box_p50'] / max(base['box_p50'], 1e-9):.1f}"
                )


if __name__ == "__main__":
    logging.getLogger("vfray.runtimes.subprocess").setLevel(logging.ERROR)
    asyncio.run(main())
