"""Runtime benchmark: sandbox start+stop latency (p50/p99) and ``run(["true"])`` throughput.

Run: ``python benchmarks/runtimes.py [--ballast-mb 300] [--docker-url unix:///path/docker.sock
--docker-image IMG]``. Docker is measured only when an engine URL is given (see
tests/test_runtime_docker.py for how to start one by hand); runtimes whose prerequisites are
missing are reported as skipped. ``--ballast-mb`` grows this process's RSS first, as a Ray worker
with pyarrow imported (~300 MB) would be: a spawn that must fork() instead of vfork() pays for it.
``--spawn-options`` also times the ways to make a child die with its parent that
``vfray/runtimes/lifeline.py`` weighs (a ``prctl`` preexec_fn, ``setpriv --pdeathsig``).
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import os
import shutil
import signal
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


async def _spawn(argv: list[str], preexec: Callable[[], None] | None) -> None:
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
        preexec_fn=preexec,
        env={"PATH": "/usr/bin:/bin"},
    )
    await proc.communicate()


async def spawn_options(runs: int) -> None:
    """ms per spawn of ``true`` (as the runtimes spawn) for each parent-death option."""
    libc = ctypes.CDLL(None, use_errno=True)

    def pdeathsig() -> None:
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG

    options: dict[str, tuple[list[str], Callable[[], None] | None]] = {
        "plain (vfork)": (["true"], None),
        "preexec_fn prctl (fork)": (["true"], pdeathsig),
    }
    if shutil.which("setpriv"):
        options["setpriv --pdeathsig"] = (["setpriv", "--pdeathsig", "KILL", "--", "true"], None)
    times: dict[str, list[float]] = {name: [] for name in options}
    for _ in range(5):  # interleaved rounds: the machine's load drifts
        for name, (argv, preexec) in options.items():
            started = time.perf_counter()
            for _ in range(max(runs // 5, 1)):
                await _spawn(argv, preexec)
            times[name].append((time.perf_counter() - started) * 1000 / max(runs // 5, 1))
    for name, values in times.items():
        print(f"spawn {name:<26}{statistics.median(values):>7.2f} ms (median of 5 rounds)")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cycles", type=int, default=100, help="start+stop cycles per runtime")
    parser.add_argument("--runs", type=int, default=200, help="run(['true']) calls per runtime")
    parser.add_argument("--ballast-mb", type=int, default=0, help="touch this much memory first")
    parser.add_argument("--only", default=None, help="comma-separated runtimes to measure")
    parser.add_argument("--spawn-options", action="store_true", help="time parent-death options")
    parser.add_argument("--docker-url", default=None)
    parser.add_argument("--docker-image", default="vfray-test:latest")
    args = parser.parse_args()
    ballast = bytearray(args.ballast_mb * 2**20)
    for page in range(0, len(ballast), 4096):
        ballast[page] = 1  # resident, not just reserved
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
    if args.only:
        candidates = {k: v for k, v in candidates.items() if k in args.only.split(",")}
    print(f"parent RSS ballast: {args.ballast_mb} MB")
    if args.spawn_options:
        await spawn_options(args.runs)
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
