"""The Ray layer's goals from one run: what Ray costs per rollout, how evenly a 3-node cluster
shares the load, how soon a command against a running cluster finishes its first rollout, and
how many chat turns one interception replica serves.

1. **CPU per rollout** (arithmetic x2, null harness, subprocess runtime, scripted model at 0 s,
   ``max_concurrent=256``): the whole process tree's CPU seconds (this process and every
   descendant: Ray's GCS, raylet and workers, the harness programs; ``children_*`` times count
   the exited ones) over a measured run, after a warm-up run on the same farm, divided by the
   rollouts. Backends: ``local``, ``ray`` with the interception in the hosts, ``ray`` with the
   Serve interception pool, each case in a fresh process. ``--rounds`` rounds, each running
   every backend once (the order turned by one each round), so a change in the machine's
   speed (a shared VM's neighbours) falls on all of them alike; the ratios are those of the
   medians, with each round's own ratio shown. Each figure is split into vfray's own
   processes (the driver, Ray's daemons and actors) and the harness programs (the exited
   children), which are the same programs on every backend.
2. **Evenness on 3 nodes** (``ray.cluster_utils.Cluster``, one CPU each, the default hosts per
   node): rollouts finished per node over a measured run; the spread is (max - min) / mean.
   Also the farm's start with its warm-up run, in seconds, and how many hosts it started again
   because Ray had placed them off their node (``HostLayout.settle``).
3. **First rollout with --address**: a head started with ``ray start`` (loopback, token auth,
   as a user's cluster would be), then ``vfray eval arithmetic -n 1 -r 2 --harness null
   --address …`` launched as a fresh command; seconds from the launch to the first rollout's
   ``ended_at`` in the run's traces. Best of ``--repeats``.
4. **Turns per replica** (``--replica``): one replica of the interception deployment (Serve,
   as ``farm.interception = "serve"`` starts it) in front of the scripted model (echo, 0 s, its
   own process), sessions registered through a SandboxHost's broker, then 64 and 256 sessions
   doing 8-turn chat episodes straight at the replica's listener from this process; turns/s and
   the replica's CPU per turn, against the same app in a plain process
   (``benchmarks/interception.py``'s server). ``1e6 / (µs per turn)`` is what one replica
   serves with a core to itself: the figure to size ``farm.interception_replicas_per_node`` by.

    python benchmarks/ray_layer.py [--tasks 256] [--rounds 3] [--repeats 3]
        [--skip-cpu|--skip-nodes|--skip-address] [--replica]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

# Read by Ray once, at its import: keeps the cluster_utils nodes on 127.0.0.1 (else Ray
# rewrites a loopback node address to the machine's outward one).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))


HARNESS = "harness programs"
"""The exited children's CPU, under this name in :func:`tree_cpu`."""


def tree_cpu() -> dict[str, float]:
    """CPU seconds of this process and all its descendants by kind (this driver, Ray's GCS,
    raylet and other daemons, each actor class and task worker by its ``ray::`` title), and
    under ``harness programs`` the exited children (their parents' ``children_*`` times, once
    reaped: the harness programs, reaped by the SandboxHost or this driver)."""
    me = psutil.Process()
    found: dict[str, float] = {}
    for proc in [me, *me.children(recursive=True)]:
        try:
            t = proc.cpu_times()
            cmd = proc.cmdline()
        except psutil.Error:
            continue
        if proc.pid == me.pid:
            kind = "driver"
        elif cmd and cmd[0].startswith("ray::"):
            kind = cmd[0].split()[0]
        else:
            kind = Path(cmd[0]).name if cmd else "?"
            if kind.startswith("python") and len(cmd) > 1:
                kind = Path(cmd[1]).name
        found[kind] = found.get(kind, 0.0) + t.user + t.system
        found[HARNESS] = found.get(HARNESS, 0.0) + t.children_user + t.children_system
    return found


def cpu_case(backend: str, interception: str, tasks: int, concurrency: int) -> dict[str, Any]:
    import vfray as vf
    from vfray.config import EvalConfig
    from vfray.tasksets.arithmetic import ArithmeticTaskset

    config = EvalConfig()
    config.farm.interception = interception  # type: ignore[assignment]
    with (
        tempfile.TemporaryDirectory() as out,
        vf.Farm(
            config=config,
            model="scripted:arithmetic?latency=0",
            harness="null",
            runtime="subprocess",
            backend=backend,
            max_concurrent=concurrency,
            output_dir=out,
            progress=False,
        ) as farm,
    ):
        farm.run(ArithmeticTaskset(num_tasks=8, seed=1), rollouts_per_task=2)  # warm-up
        before, start = tree_cpu(), time.perf_counter()
        result = farm.run(ArithmeticTaskset(num_tasks=tasks), rollouts_per_task=2)
        wall, after = time.perf_counter() - start, tree_cpu()
        table = result.traces
    rollouts = table.num_rows
    by_kind = {k: after[k] - before.get(k, 0.0) for k in after}
    errors = [
        f"{kind}: {message}"
        for ok, kind, message in zip(
            table.column("ok").to_pylist(),
            table.column("error_type").to_pylist(),
            table.column("error_message").to_pylist(),
            strict=True,
        )
        if not ok
    ]
    return {
        "rollouts": rollouts,
        "errors": len(errors),
        "first_error": errors[0][:200] if errors else "",
        "rate": rollouts / wall,
        "cpu_ms": 1000 * sum(by_kind.values()) / rollouts,
        "harness_ms": 1000 * by_kind.get(HARNESS, 0.0) / rollouts,
        "by_kind_ms": {
            k: 1000 * v / rollouts
            for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])
            if 1000 * v / rollouts >= 0.5
        },
    }


def cpu_case_in_a_fresh_process(
    backend: str, interception: str, tasks: int, concurrency: int
) -> dict[str, Any]:
    """:func:`cpu_case` in a process of its own: a process that has run Ray keeps Ray's
    threads and imports, which raised the local backend's own CPU per rollout measured after a
    Ray case in the same process by 5-6 ms (8.1 -> 12.7-14.4 ms)."""
    argv = [sys.executable, __file__, "--cpu-case", backend, interception]
    argv += ["--tasks", str(tasks), "--concurrency", str(concurrency)]
    done = subprocess.run(argv, capture_output=True, text=True, check=False, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"the {backend} case failed: {done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def run_cpu(args: argparse.Namespace) -> None:
    print(
        f"\n== CPU per rollout: {args.tasks} tasks x 2, c={args.concurrency}, "
        f"{os.cpu_count()} cores, {args.rounds} rounds =="
    )
    print(
        f"{'round':<6}{'backend':<22}{'rollouts/s':>11}{'CPU ms/rollout':>16}"
        f"{'vfray':>8}{'harness':>9}{'errors':>8}"
    )
    cases = [("local", "host"), ("ray", "host"), ("ray", "serve")]
    runs: dict[str, list[dict[str, Any]]] = {}
    for round_ in range(args.rounds):
        turned = cases[round_ % len(cases) :] + cases[: round_ % len(cases)]
        for backend, mode in turned:
            label = backend if backend == "local" else f"ray, interception={mode}"
            r = cpu_case_in_a_fresh_process(backend, mode, args.tasks, args.concurrency)
            runs.setdefault(label, []).append(r)
            print(
                f"{round_ + 1:<6}{label:<22}{r['rate']:>11.1f}{r['cpu_ms']:>16.1f}"
                f"{r['cpu_ms'] - r['harness_ms']:>8.1f}{r['harness_ms']:>9.1f}{r['errors']:>8}",
                flush=True,
            )
            print(
                "      by process: " + ", ".join(f"{k} {v:.1f}" for k, v in r["by_kind_ms"].items())
            )
            if r["first_error"]:
                print(f"      first error: {r['first_error']}")

    def median(label: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[label])

    print("medians:")
    for label in runs:
        own = statistics.median(r["cpu_ms"] - r["harness_ms"] for r in runs[label])
        print(
            f"  {label:<22} {median(label, 'rate'):.1f} rollouts/s, "
            f"{median(label, 'cpu_ms'):.1f} ms CPU per rollout (vfray {own:.1f}, "
            f"harness programs {median(label, 'harness_ms'):.1f})"
        )
    for label in runs:
        if label == "local":
            continue
        per_round = [
            r["cpu_ms"] / base["cpu_ms"] for r, base in zip(runs[label], runs["local"], strict=True)
        ]
        print(
            f"  {label} vs local: CPU/rollout "
            f"{median(label, 'cpu_ms') / median('local', 'cpu_ms'):.2f}x"
            f" (rounds: {', '.join(f'{x:.2f}' for x in per_round)}), rollouts/s "
            f"{median(label, 'rate') / median('local', 'rate'):.2f}x"
        )
    serve, host = "ray, interception=serve", "ray, interception=host"
    print(f"  serve vs host: rollouts/s {median(serve, 'rate') / median(host, 'rate'):.2f}x")


class _PlacementLog(logging.Handler):
    """Counts the SandboxHosts the farm started again because Ray placed them off their node
    (``HostLayout.settle`` logs each round)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.restarted = self.rounds = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "came up off their node" in record.getMessage():
            self.restarted += int(record.args[0])  # type: ignore[index]
            self.rounds += 1


def run_nodes(args: argparse.Namespace) -> None:
    import ray
    from ray.cluster_utils import Cluster

    import vfray as vf
    from actors import cluster as vcluster
    from vfray.tasksets.arithmetic import ArithmeticTaskset

    print("\n== 3 nodes (cluster_utils, 1 CPU each), default hosts per node ==")
    # The CPU part's local Rays left their auth settings cached in this process: without
    # dropping them the driver's GCS client waits forever on the cluster's own.
    from actors import _local_ray

    _local_ray.restore_auth_settings()
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "node_ip_address": "127.0.0.1",
            "include_dashboard": False,
            "_system_config": _local_ray.worker_system_config(),
        },
    )
    for _ in range(2):
        cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
    cluster.wait_for_nodes()
    restarts = _PlacementLog()
    logging.getLogger("actors.cluster").addHandler(restarts)
    logging.getLogger("actors.cluster").setLevel(logging.INFO)
    try:
        vcluster.connect(cluster.address)
        started = time.perf_counter()
        with (
            tempfile.TemporaryDirectory() as out,
            vf.Farm(
                model="scripted:arithmetic?latency=0.2",
                harness="null",
                runtime="subprocess",
                address=cluster.address,
                max_concurrent=args.concurrency,
                output_dir=out,
                progress=False,
            ) as farm,
        ):
            farm.run(ArithmeticTaskset(num_tasks=6, seed=1), rollouts_per_task=2)  # warm-up
            print(
                f"  farm start and warm-up run: {time.perf_counter() - started:.1f} s; hosts "
                f"started again off their node: {restarts.restarted} in {restarts.rounds} rounds"
            )
            before = {h["pid"]: h["completed"] for h in farm.host_stats()}
            farm.run(ArithmeticTaskset(num_tasks=args.tasks // 2), rollouts_per_task=2)
            per_node: dict[str, int] = {}
            for h in farm.host_stats():
                done = h["completed"] - before.get(h["pid"], 0)
                per_node[h["node_id"][:8]] = per_node.get(h["node_id"][:8], 0) + done
                print(f"  host pid {h['pid']} on node {h['node_id'][:8]}: {done} rollouts")
    finally:
        logging.getLogger("actors.cluster").removeHandler(restarts)
        ray.shutdown()
        cluster.shutdown()  # type: ignore[no-untyped-call]
    counts = list(per_node.values())
    mean = sum(counts) / len(counts)
    print("rollouts per node: " + ", ".join(f"{n} {c}" for n, c in sorted(per_node.items())))
    spread = (max(counts) - min(counts)) / mean
    print(f"  nodes used {len(counts)} of 3, spread (max - min) / mean {spread:.1%}")


def first_rollout(address: str, env: dict[str, str], out: Path) -> tuple[float, float]:
    import pyarrow.parquet as pq

    vfray = str(Path(sys.executable).parent / "vfray")
    argv = [vfray, "eval", "arithmetic", "-n", "1", "-r", "2", "--harness", "null"]
    argv += ["--address", address, "--output-dir", str(out)]
    launched = time.time()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, check=False)
    wall = time.time() - launched
    if done.returncode != 0:
        raise SystemExit(f"vfray eval failed: {done.stderr[-2000:]}")
    ends = [
        t.timestamp()
        for part in out.glob("**/traces/*.parquet")
        for t in pq.read_table(part, columns=["ended_at"]).column("ended_at").to_pylist()
        if t is not None
    ]
    return min(ends) - launched, wall


def run_address(args: argparse.Namespace) -> None:
    from ray_head import ray_head  # tests/ray_head.py: a loopback head with token auth

    print("\n== first rollout with --address to a running head (ray start, token auth) ==")
    with ray_head() as head, tempfile.TemporaryDirectory() as root:
        address = head.markers[1]
        env = {**head.env, "PYTHONPATH": str(ROOT)}
        firsts, walls = [], []
        for i in range(args.repeats):
            first, wall = first_rollout(address, env, Path(root) / str(i))
            firsts.append(first)
            walls.append(wall)
            print(f"  run {i + 1}: first rollout {first:.2f} s after launch, command {wall:.2f} s")
    print(f"  best first rollout {min(firsts):.2f} s (goal: within 3 s)")


async def _replica_loads(
    pool: Any, levels: tuple[int, ...], seconds: float, turns: int
) -> list[dict[str, Any]]:
    """For each level, register that many sessions with the pool's replica through a broker
    (what a SandboxHost does), drive them with ``benchmarks/interception.py``'s load, conclude
    them. One broker (a process holds one Serve handle) and one loop for all levels."""
    from actors.interception_pool import ServeBroker

    broker = ServeBroker(pool)
    await broker.url()  # waits for the replica
    return [await _replica_load(broker, sessions, seconds, turns) for sessions in levels]


async def _replica_load(broker: Any, sessions: int, seconds: float, turns: int) -> dict[str, Any]:
    from interception import _load

    from vfray.interception import Limits
    from vfray.trace import TaskRecord, Trace

    secrets = [
        await broker.register(Trace(task=TaskRecord(key=str(i), hash="h")), Limits(), None, None)
        for i in range(sessions)
    ]
    url = broker.endpoint(secrets[0])
    assert url is not None
    stats = await broker.handle.stats.remote(**broker._route())
    replica = psutil.Process(stats["pid"])
    before = replica.cpu_times()
    result = await _load(url.removesuffix("/v1"), secrets, sessions, seconds, turns)
    after = replica.cpu_times()
    for secret in secrets:
        await broker.conclude(secret)
    cpu = after.user + after.system - before.user - before.system
    return {**result, "cpu_us": _per_turn(cpu, result["turns_s"], seconds)}


LEVELS = (64, 256)
"""Concurrent sessions in the replica part's two rows."""
WARM_UP_S = 1.0
"""``benchmarks/interception.py``'s load warms up for this long before it measures."""


def _per_turn(cpu_s: float, turns_s: float, seconds: float) -> float:
    """CPU microseconds per turn over a whole load, its warm-up counted at the measured rate
    (the same for the replica and the plain process)."""
    return 1e6 * cpu_s / (turns_s * (seconds + WARM_UP_S))


def run_replica(args: argparse.Namespace) -> None:
    import ray
    from interception import Served, _cpu_seconds, _load

    from actors import _local_ray
    from actors.interception_pool import start_pool, stop_pool

    seconds, turns = 6.0, 8
    print(f"\n== turns per interception replica: {turns}-turn episodes, {seconds:g} s a row ==")
    model = Served("model")
    ray.init(
        num_cpus=os.cpu_count(),
        include_dashboard=False,
        _system_config=_local_ray.worker_system_config(),
        log_to_driver=False,
    )
    rows: list[tuple[str, int, dict[str, Any]]] = []
    try:
        pool = start_pool(
            base_url=f"{model.url}/v1", model="bench", sampling={}, api_key_var=None, replicas=1
        )
        try:
            loads = asyncio.run(_replica_loads(pool, LEVELS, seconds, turns))
            rows += [("serve replica", n, r) for n, r in zip(LEVELS, loads, strict=True)]
        finally:
            stop_pool(pool)
        for sessions in LEVELS:
            plain = Served("vfray", f"{model.url}/v1", sessions)
            try:
                cpu0 = _cpu_seconds(plain.proc.pid)
                result = asyncio.run(_load(plain.url, plain.secrets, sessions, seconds, turns))
                cpu = _cpu_seconds(plain.proc.pid) - cpu0
            finally:
                plain.close()
            cpu_us = _per_turn(cpu, result["turns_s"], seconds)
            rows.append(("plain process", sessions, {**result, "cpu_us": cpu_us}))
    finally:
        ray.shutdown()
        model.close()
    print(
        f"{'server':<15}{'sessions':>9}{'turns/s':>9}{'p50 ms':>8}{'p99 ms':>8}{'CPU us/turn':>13}"
    )
    for name, sessions, r in rows:
        print(
            f"{name:<15}{sessions:>9}{r['turns_s']:>9.0f}{r['p50']:>8.2f}{r['p99']:>8.2f}"
            f"{r['cpu_us']:>13.0f}"
        )
    replica = min(r["cpu_us"] for name, _, r in rows if name == "serve replica")
    print(f"  one replica with a core to itself: ~{1e6 / replica:.0f} turns/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=256, help="tasks per measured run (x2)")
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3, help="CPU part: rounds of all backends")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-cpu", action="store_true")
    parser.add_argument("--skip-nodes", action="store_true")
    parser.add_argument("--skip-address", action="store_true")
    parser.add_argument("--replica", action="store_true", help="also: turns per replica")
    parser.add_argument("--cpu-case", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cpu_case:
        backend, interception = args.cpu_case
        print(json.dumps(cpu_case(backend, interception, args.tasks, args.concurrency)))
        return
    if not args.skip_cpu:
        run_cpu(args)
    if not args.skip_nodes:
        run_nodes(args)
    if not args.skip_address:
        run_address(args)
    if args.replica:
        run_replica(args)


if __name__ == "__main__":
    main()
