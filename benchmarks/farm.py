"""Farm throughput and interception capacity.

Part 1 runs the arithmetic taskset through ``Farm`` (null harness, subprocess runtime, scripted
model at 0 s and 2 s latency) with 1, 2 and 4 SandboxHosts on one node and 3 hosts on a 3-node
simulated cluster, each with the interception in the hosts and as a Ray Serve deployment
(``--interception host,serve``), printing rollouts/s, the peak number of rollouts in flight on
the hosts and ratios (hosts vs 1 host, serve vs host). Part 2 drives one node's interception
directly (three processes: the scripted model with 2 s latency, the interception, and this load
generator), ramping concurrent sessions of one turn each (1k, 2k, 5k, 10k) until a stage has
errors.

    python benchmarks/farm.py               # ~8 minutes on 2 cores
    python benchmarks/farm.py --quick       # ~3 minutes
    python benchmarks/farm.py --skip-capacity --skip-cluster --hosts 1 --latencies 0  # host/serve
    python benchmarks/farm.py --tasks 200 --concurrency 256 --sessions 1000,5000,10000,15000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


def raise_fd_limit() -> int:
    """Every session holds a socket in each of three processes: lift the soft fd limit to the
    hard one (children inherit it) and return it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = 1 << 20
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


# -- part 1: the farm -------------------------------------------------------------------------


class PeakSampler:
    """Polls the hosts' ``stats()`` in a thread and keeps the peak of rollouts in flight."""

    def __init__(self, hosts: list[Any], every: float = 0.2) -> None:
        self.hosts, self.every, self.peak = hosts, every, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        import ray

        while not self._stop.is_set():
            try:
                stats = ray.get([h.stats.remote() for h in self.hosts], timeout=10)
                self.peak = max(self.peak, sum(s["in_flight"] for s in stats))
            except Exception:  # a slow poll must not end the benchmark
                pass
            self._stop.wait(self.every)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def farm_case(
    hosts: int,
    latency: float,
    tasks: int,
    concurrency: int,
    address: str | None,
    interception: str = "host",
) -> dict[str, Any]:
    from vfray.config import EvalConfig
    from vfray.farm import Farm
    from vfray.tasksets.arithmetic import ArithmeticTaskset

    config = EvalConfig()
    config.farm.interception = interception  # type: ignore[assignment]

    with (
        tempfile.TemporaryDirectory() as out,
        Farm(
            config=config,
            model=f"scripted:arithmetic?latency={latency:g}",
            harness="null",
            runtime="subprocess",
            hosts=hosts,
            max_concurrent=concurrency,
            output_dir=out,
            progress=False,
            address=address,
        ) as farm,
    ):
        # Warm-up: starts the actors and their worker imports outside the timed run.
        farm.run(ArithmeticTaskset(num_tasks=hosts * 2, seed=1), rollouts_per_task=2)
        with PeakSampler(farm._hosts) as sampler:
            start = time.perf_counter()
            result = farm.run(ArithmeticTaskset(num_tasks=tasks), rollouts_per_task=2)
            wall = time.perf_counter() - start
        table = result.traces
        ok = sum(table.column("ok").to_pylist())
        import ray

        nodes = {ray.get(h.stats.remote())["node_id"] for h in farm._hosts}
    return {
        "rollouts": table.num_rows,
        "errors": table.num_rows - ok,
        "wall": wall,
        "rate": table.num_rows / wall,
        "peak": sampler.peak,
        "nodes": len(nodes),
    }


def _tag(mode: str) -> str:
    """The label suffix of an interception mode (none for the in-host default)."""
    return "" if mode == "host" else f", {mode}"


def run_farm(args: argparse.Namespace) -> None:
    import ray

    from actors import cluster as vcluster

    latencies = [float(x) for x in args.latencies.split(",")]
    modes = args.interception.split(",")
    results: dict[tuple[str, float], dict[str, Any]] = {}
    print(f"\n== Farm: arithmetic x2, null harness, subprocess runtime, {os.cpu_count()} cores ==")
    print(
        f"{'setup':<30}{'latency':>8}{'rollouts':>9}{'errors':>7}{'wall s':>8}"
        f"{'rollouts/s':>11}{'peak in flight':>15}{'nodes':>6}"
    )

    def show(label: str, latency: float, r: dict[str, Any]) -> None:
        results[(label, latency)] = r
        print(
            f"{label:<30}{latency:>7g}s{r['rollouts']:>9}{r['errors']:>7}{r['wall']:>8.1f}"
            f"{r['rate']:>11.1f}{r['peak']:>15}{r['nodes']:>6}",
            flush=True,
        )

    vcluster.connect(None)
    try:
        for latency in latencies:
            tasks = args.tasks if latency == 0 else args.tasks_slow
            for hosts in args.hosts:
                for mode in modes:
                    show(
                        f"1 node, {hosts} host(s){_tag(mode)}",
                        latency,
                        farm_case(hosts, latency, tasks, args.concurrency, None, mode),
                    )
    finally:
        ray.shutdown()

    if not args.skip_cluster:
        from ray.cluster_utils import Cluster

        from actors._local_ray import worker_system_config

        sim = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 1,
                "node_ip_address": "127.0.0.1",
                "include_dashboard": False,
                "_system_config": worker_system_config(),
            },
        )
        for _ in range(2):
            sim.add_node(num_cpus=1, node_ip_address="127.0.0.1")
        sim.wait_for_nodes()
        try:
            vcluster.connect(sim.address)
            for latency in latencies:
                tasks = args.tasks if latency == 0 else args.tasks_slow
                for mode in modes:
                    show(
                        f"3 nodes, 3 hosts{_tag(mode)}",
                        latency,
                        farm_case(3, latency, tasks, args.concurrency, sim.address, mode),
                    )
        finally:
            ray.shutdown()
            sim.shutdown()  # type: ignore[no-untyped-call]

    print("\nratios (rollouts/s):")
    for latency in latencies:
        base = results.get(("1 node, 1 host(s)", latency))
        if base is None:
            continue
        for (label, lat), r in results.items():
            if lat == latency and label != "1 node, 1 host(s)" and "," not in label[7:]:
                print(f"  {label} vs 1 host @ {latency:g}s: {r['rate'] / base['rate']:.2f}x")
    if "serve" in modes and "host" in modes:
        for (label, lat), r in results.items():
            host = results.get((label.removesuffix(_tag("serve")), lat))
            if label.endswith(_tag("serve")) and host is not None:
                print(
                    f"  {label.removesuffix(_tag('serve'))} @ {lat:g}s: serve vs host "
                    f"{r['rate'] / host['rate']:.2f}x"
                )
    if 0.0 in latencies and 2.0 in latencies and "host" in modes:
        for hosts in args.hosts:
            fast, slow = (
                results[(f"1 node, {hosts} host(s)", 0.0)],
                results[(f"1 node, {hosts} host(s)", 2.0)],
            )
            print(f"  {hosts} host(s): 2 s latency vs 0 s: {slow['rate'] / fast['rate']:.2f}x")


# -- part 2: interception capacity ------------------------------------------------------------


async def _serve_model(latency: float) -> None:
    from vfray.endpoints.serving import serve_in_loop
    from vfray.models.scripted.server import ScriptedModel

    app = ScriptedModel("echo", latency=latency, history_size=1)
    async with serve_in_loop(app, timeout_keep_alive=600) as url:
        print(json.dumps({"url": url + "/v1"}), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


async def _serve_interception(upstream: str, connection_limit: int) -> None:
    """Serves the interception; stdin commands: ``register N`` (prints N secrets) and
    ``conclude`` (concludes them, prints the ModelCalls recorded and the errors on traces)."""
    from vfray.interception import Interception, Upstream
    from vfray.trace import TaskRecord, Trace

    loop = asyncio.get_running_loop()
    upstream_cfg = Upstream(upstream, model="bench", sampling={"temperature": 0.0})
    async with Interception(upstream_cfg, connection_limit=connection_limit) as icpt:
        print(json.dumps({"url": icpt.url}), flush=True)
        secrets: list[str] = []
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            command = line.split()
            if command[0] == "register":
                secrets = [
                    icpt.app.register(Trace(task=TaskRecord(key=str(i), hash="h")))
                    for i in range(int(command[1]))
                ]
                print(json.dumps(secrets), flush=True)
            elif command[0] == "conclude":
                traces = [icpt.app.conclude(s) for s in secrets]
                calls = sum(len(t.calls) for t in traces)
                errors = sum(len(t.errors) for t in traces)
                print(json.dumps({"calls": calls, "errors": errors}), flush=True)


class Served:
    def __init__(self, *argv: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        self.url: str = self.read()["url"]

    def read(self) -> Any:
        assert self.proc.stdout is not None
        return json.loads(self.proc.stdout.readline())

    def ask(self, command: str) -> Any:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.read()

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()  # the server exits when its stdin closes
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


async def _one_stage(
    http: aiohttp.ClientSession, url: str, secrets: list[str]
) -> tuple[list[tuple[float, float]], dict[str, int]]:
    spans: list[tuple[float, float]] = []
    failures: dict[str, int] = {}
    body = {"model": "m", "messages": [{"role": "user", "content": "What is 1 + 2?"}]}

    async def turn(secret: str) -> None:
        start = time.perf_counter()
        try:
            headers = {"authorization": f"Bearer {secret}"}
            async with http.post(f"{url}/chat/completions", json=body, headers=headers) as r:
                raw = await r.read()
            if r.status != 200 or not json.loads(raw).get("choices"):
                failures[f"HTTP {r.status}"] = failures.get(f"HTTP {r.status}", 0) + 1
                return
        except Exception as exc:
            failures[type(exc).__name__] = failures.get(type(exc).__name__, 0) + 1
            return
        spans.append((start, time.perf_counter()))

    await asyncio.gather(*(turn(s) for s in secrets))
    return spans, failures


def _peak_overlap(spans: list[tuple[float, float]]) -> int:
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    peak = level = 0
    for _, delta in events:
        level += delta
        peak = max(peak, level)
    return peak


async def _capacity(args: argparse.Namespace) -> None:
    stages = [int(x) for x in args.sessions.split(",")]
    model = Served("--serve", "model", "--latency", str(args.latency))
    icpt = Served(
        "--serve",
        "interception",
        "--upstream",
        model.url,
        "--connection-limit",
        str(args.connection_limit),
    )
    print(
        f"\n== Interception capacity: one turn per session, scripted model at "
        f"{args.latency:g} s, upstream connection limit {args.connection_limit} =="
    )
    print(
        f"{'sessions':>9}{'ok':>8}{'errors':>8}{'wall s':>8}{'p50 s':>7}{'p99 s':>7}"
        f"{'peak concurrent':>16}{'recorded':>9}  CPU ms/turn: {'icpt':>6}{'model':>7}{'client':>7}"
    )
    held = 0
    try:
        timeout = aiohttp.ClientTimeout(total=600)
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
            for n in stages:
                secrets = icpt.ask(f"register {n}")
                cpu = [icpt.cpu_seconds(), model.cpu_seconds(), time.process_time()]
                start = time.perf_counter()
                spans, failures = await _one_stage(http, icpt.url, secrets)
                wall = time.perf_counter() - start
                after = [icpt.cpu_seconds(), model.cpu_seconds(), time.process_time()]
                per_turn = [
                    1000 * (b - a) / max(1, len(spans)) for a, b in zip(cpu, after, strict=True)
                ]
                recorded = icpt.ask("conclude")
                lat = sorted(e - s for s, e in spans) or [0.0]
                errors = sum(failures.values()) + recorded["errors"]
                print(
                    f"{n:>9}{len(spans):>8}{errors:>8}{wall:>8.1f}"
                    f"{statistics.median(lat):>7.2f}{lat[int(0.99 * (len(lat) - 1))]:>7.2f}"
                    f"{_peak_overlap(spans):>16}{recorded['calls']:>9}"
                    f"{per_turn[0]:>20.2f}{per_turn[1]:>7.2f}{per_turn[2]:>7.2f}",
                    flush=True,
                )
                if errors or recorded["calls"] != n:
                    print(f"  failures: {failures}, trace errors: {recorded['errors']}")
                    break
                held = n
    finally:
        icpt.close()
        model.close()
    print(
        f"largest stage held with 0 errors: {held} concurrent sessions "
        f"({held / max(stages):.0%} of the {max(stages)} aimed at)"
    )


# -- main -------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller runs (~1.5 minutes)")
    parser.add_argument("--tasks", type=int, default=40, help="tasks at 0 s latency (x2 rollouts)")
    parser.add_argument("--tasks-slow", type=int, default=64, help="tasks at 2 s latency")
    parser.add_argument("--concurrency", type=int, default=64, help="Farm max_concurrent")
    parser.add_argument("--hosts", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4])
    parser.add_argument("--latencies", default="0,2", help="scripted model latencies (s)")
    parser.add_argument(
        "--interception", default="host,serve", help="farm.interception modes to compare"
    )
    parser.add_argument("--sessions", default="1000,2000,5000,10000", help="capacity ramp")
    parser.add_argument("--latency", type=float, default=2.0, help="capacity: model latency")
    parser.add_argument(
        "--connection-limit",
        type=int,
        default=4096,
        help="capacity: the interception's upstream connection limit",
    )
    parser.add_argument("--skip-farm", action="store_true")
    parser.add_argument("--skip-cluster", action="store_true")
    parser.add_argument("--skip-capacity", action="store_true")
    parser.add_argument("--serve", choices=["model", "interception"], help=argparse.SUPPRESS)
    parser.add_argument("--upstream", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.serve == "model":
        asyncio.run(_serve_model(args.latency))
        return
    if args.serve == "interception":
        asyncio.run(_serve_interception(args.upstream, args.connection_limit))
        return
    if args.quick:
        args.tasks, args.tasks_slow, args.hosts = 16, 32, [1, 2]
        args.sessions = "1000,2000,5000"
    print(f"RLIMIT_NOFILE soft limit: {raise_fd_limit()}")
    if not args.skip_farm:
        run_farm(args)
    if not args.skip_capacity:
        asyncio.run(_capacity(args))


if __name__ == "__main__":
    main()
