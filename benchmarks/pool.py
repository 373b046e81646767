"""Pool benchmark: the ``pool`` harness's one warm worker process against a fresh worker per
rollout (``pooled=False``, the same program and protocol) and against the ``bash`` harness (the
chat loop, a program started in each box), on the write-a-file task with the scripted ``agent``
model at zero latency (three model calls and two commands a rollout).

Per mode it prints rollouts/s and the CPU seconds per rollout of the whole process tree (this
process, the interception, the scripted model, the workers, the boxes: ``cpu_seconds`` counts
reaped children, so each run ends after its workers are torn down). The load average is printed
too: on a shared machine it moves the figures more than anything measured here.

Run: ``python benchmarks/pool.py [--runtime bwrap|subprocess] [--rollouts 64] [--concurrency 16]
[--repeat 2]``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import time

from rollouts import cpu_seconds

import vfray as vf
from vfray.runtimes.base import Runtime

PROMPT = 'Write "hello agent" to out.txt, then check it.'
MODES = {
    "pool (one warm worker)": ("pool", {"idle_seconds": 0}),
    "pool, pooled=False (a worker per rollout)": ("pool", {"pooled": False}),
    "bash (the chat loop in each box)": ("bash", {}),
}


class WriteFile(vf.Task[vf.TaskData]):
    @vf.reward
    async def wrote_it(self, runtime: Runtime) -> bool:
        return (await runtime.read("out.txt")) == b"hello agent\n"


async def measure(
    harness: str, options: dict[str, object], runtime: str, count: int, concurrency: int
) -> tuple[float, float, int]:
    """rollouts/s, CPU seconds per rollout, and how many rollouts did not score 1."""
    workdir = "/box" if runtime == "bwrap" else None
    tasks = [
        WriteFile(vf.TaskData(prompt=PROMPT, workdir=workdir), key=f"w{i}") for i in range(count)
    ]
    gate = asyncio.Semaphore(concurrency)
    env = vf.LocalEnvironment(
        "scripted:agent", harness=harness, runtime=runtime, harness_options=options
    )

    async def one(task: WriteFile) -> vf.Trace:
        async with gate:
            return await env.rollout(task)

    async with env:
        await one(tasks[0])  # warm-up: imports, page cache
        await asyncio.sleep(0.5)  # the warm-up's worker retires (idle_seconds=0)
        cpu0, t0 = cpu_seconds(), time.perf_counter()
        traces = await asyncio.gather(*(one(t) for t in tasks))
        elapsed = time.perf_counter() - t0
        await asyncio.sleep(0.5)  # the last worker is torn down and reaped: its CPU counts
        cpu = cpu_seconds() - cpu0
    bad = sum(1 for t in traces if t.reward != 1.0)
    return count / elapsed, cpu / count, bad


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runtime", default="bwrap", choices=["bwrap", "subprocess"])
    parser.add_argument("--rollouts", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    load = "/".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"{os.cpu_count()} CPUs, load {load}; runtime {args.runtime}; {args.rollouts} rollouts "
        f"at concurrency {args.concurrency}, best of {args.repeat}"
    )
    rows = {}
    for name, (harness, options) in MODES.items():
        runs = [
            await measure(harness, options, args.runtime, args.rollouts, args.concurrency)
            for _ in range(args.repeat)
        ]
        rate, cpu, bad = max(runs)
        rows[name] = (rate, cpu)
        print(
            f"  {name}: {rate:.2f} rollouts/s, {cpu * 1000:.0f} ms CPU per rollout"
            + (f", {bad} not scored 1" if bad else "")
        )
    base_rate, base_cpu = rows["pool, pooled=False (a worker per rollout)"]
    rate, cpu = rows["pool (one warm worker)"]
    print(
        f"  pooled / a worker per rollout: x{rate / base_rate:.2f} rollouts/s, "
        f"x{cpu / base_cpu:.2f} CPU per rollout"
    )
    load = "/".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"  load now {load}")


if __name__ == "__main__":
    logging.getLogger("vfray.runtimes.subprocess").setLevel(logging.ERROR)
    logging.getLogger("vfray.runtimes.registry").setLevel(logging.ERROR)
    asyncio.run(main())
