"""MCP tool-call overhead: p50/p99 per call of a trivial tool served in-box (the in-box server
program on loopback), host-side (a per-rollout binding on the host's tool server) and shared
(one shared toolset, a binding per rollout), and the shared server under 256 concurrent
rollouts. Servers run in processes of their own; the client is the bash harness's stdlib MCP
client (``chat_loop.McpClient``), in threads. Prints figures and ratios; asserts nothing.

    python benchmarks/tools.py [--calls 300] [--concurrency 256]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.fixtures.tool_sets import Faulty as Echo  # noqa: E402  (importable in the box)
from vfray.tools import Scope  # noqa: E402


class SharedEcho(Echo):
    name = "shared_echo"
    scope = Scope.SHARED


def _client_module():  # type: ignore[no-untyped-def]
    path = ROOT / "vfray" / "harnesses" / "programs" / "chat_loop.py"
    spec = importlib.util.spec_from_file_location("chat_loop", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def _serve_host(bindings: int) -> None:
    from vfray.tools._mcp_app import Binding
    from vfray.tools.host import host_server

    server = host_server()
    own = await server.bind(Binding(server="echo", toolset=Echo()))
    shared = server.shared_instance(SharedEcho())
    urls = [
        await server.bind(Binding(server="shared_echo", toolset=shared)) for _ in range(bindings)
    ]
    print(json.dumps({"host": own, "shared": urls}), flush=True)
    await asyncio.Event().wait()


def _percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return ordered[len(ordered) // 2] * 1000, ordered[int(len(ordered) * 0.99) - 1] * 1000


def _timed_calls(client_cls, url: str, n: int) -> list[float]:  # type: ignore[no-untyped-def]
    client = client_cls("b", url, 30)
    client.start()
    out = []
    for i in range(n):
        t = time.perf_counter()
        assert client.call("fine", {"x": i}) == str(2 * i)
        out.append(time.perf_counter() - t)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--serve-host", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_host:
        asyncio.run(_serve_host(args.serve_host))
        return
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    host = subprocess.Popen(
        [sys.executable, __file__, "--serve-host", str(args.concurrency)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    tmp = Path(tempfile.mkdtemp())
    (tmp / "spec.pkl").write_bytes(pickle.dumps(Echo()))
    box = subprocess.Popen(
        [sys.executable, "-m", "vfray.tools._box", str(tmp / "spec.pkl"), str(tmp / "log")],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert host.stdout and box.stdout
        urls = json.loads(host.stdout.readline())
        port = box.stdout.readline().split()[-1]
        client = _client_module().McpClient
        rows = {
            "in-box (loopback)": _timed_calls(
                client, f"http://127.0.0.1:{port}/mcp/box", args.calls
            ),
            "host-side (per rollout)": _timed_calls(client, urls["host"], args.calls),
            "shared (c=1)": _timed_calls(client, urls["shared"][0], args.calls),
        }
        per = max(args.calls // args.concurrency, 5)
        started = time.perf_counter()
        with ThreadPoolExecutor(args.concurrency) as pool:
            results = list(pool.map(lambda u: _timed_calls(client, u, per), urls["shared"]))
        wall = time.perf_counter() - started
        rows[f"shared (c={args.concurrency})"] = [s for r in results for s in r]
        base = statistics.median(rows["in-box (loopback)"])
        print(f"{'placement':28} {'p50 ms':>8} {'p99 ms':>8} {'p50 vs in-box':>14}")
        for name, samples in rows.items():
            p50, p99 = _percentiles(samples)
            print(f"{name:28} {p50:8.2f} {p99:8.2f} {statistics.median(samples) / base:13.2f}x")
        total = args.concurrency * per
        print(
            f"shared at c={args.concurrency}: {total} calls in {wall:.1f}s = "
            f"{total / wall:.0f} calls/s"
            f" (client threads in one process, {threading.active_count()} threads left)"
        )
    finally:
        for p in (host, box):
            p.terminate()
            p.wait(5)


if __name__ == "__main__":
    main()
