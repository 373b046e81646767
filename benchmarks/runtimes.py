"""Runtime benchmark: sandbox start+stop latency (p50/p99) and ``run(["true"])`` throughput.

Run: ``python benchmarks/runtimes.py [--docker-url unix:///path/docker.sock --docker-image IMG]``.
Docker is measured only when an engine URL is given (see tests/test_runtime_docker.py for how
to start one by hand); runtimes whose prerequisites are missing are reported as skipped.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable

from vfray.runtimes.base import Runtime, RuntimeSpec
from vfray.runtimes.registry import make_runtime


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(factory: Callable[[], Runtime], cycles: int, runs: int) -> dict[str, float]:
    latencies = []
    for _ in range(cycles):
        rt = factory()
        started = time.perf_counter()
        await rt.start()
        await rt.stop()
        latencies.append((time.perf_counter() - started) * 1000)
    rt = factory()
    await rt.start()
    try:
        started = time.perf_counter()
        for _ in range(runs):
            result = await rt.run(["true"], timeout=60)
            if not result.ok:
                raise RuntimeError(f"`true` failed: {result}")
        elapsed = time.perf_counter() - started
    finally:
        await rt.stop()
    return {
        "p50": _pct(latencies, 0.5),
        "p99": _pct(latencies, 0.99),
        "mean": statistics.fmean(latencies),
        "runs_per_s": runs / elapsed,
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cycles", type=int, default=100, help="start+stop cycles per runtime")
    parser.add_argument("--runs", type=int, default=200, help="run(['true']) calls per runtime")
    parser.add_argument("--docker-url", default=None)
    parser.add_argument("--docker-image", default="vfray-test:latest")
    args = parser.parse_args()
    python_root = os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))
    candidates: dict[str, Callable[[], Runtime] | str] = {
        "subprocess": lambda: make_runtime("subprocess"),
        "bwrap": (lambda: make_runtime("bwrap")) if shutil.which("bwrap") else "no bwrap",
        "docker": (
            (
                lambda: make_runtime(
                    "docker",
                    RuntimeSpec(image=args.docker_image),
                    base_url=args.docker_url,
                    volumes={"/usr": "/usr", python_root: python_root},
                )
            )
            if args.docker_url
            else "no --docker-url"
        ),
    }
    print(f"{'runtime':<12}{'start+stop p50':>16}{'p99':>10}{'run(true)/s':>14}")
    rows = {}
    for name, factory in candidates.items():
        if isinstance(factory, str):
            print(f"{name:<12}{'skipped: ' + factory:>40}")
            continue
        cycles = min(args.cycles, 20) if name == "docker" else args.cycles
        rows[name] = row = await measure(factory, cycles, args.runs)
        print(f"{name:<12}{row['p50']:>13.1f} ms{row['p99']:>7.1f} ms{row['runs_per_s']:>14.0f}")
    if "subprocess" in rows:
        base = rows["subprocess"]
        for name, row in rows.items():
            if name != "subprocess":
                print(
                    f"{name} vs subprocess: start+stop p50 x{row['p50'] / base['p50']:.1f}, "
                    f"run throughput x{row['runs_per_s'] / base['runs_per_s']:.2f}"
                )


if __name__ == "__main__":
    import logging

    logging.getLogger("vfray.runtimes.subprocess").setLevel(logging.ERROR)
    asyncio.run(main())
