"""MCP tool-call overhead, in four parts (``--parts``), each a table of p50/p99 per call of a
trivial tool (``fine(x) -> 2x``) with ratios, and calls/s under concurrency; asserts nothing.

- ``placement``: served in-box (the in-box server program on loopback), host-side (a
  per-rollout binding on the host's tool server) and shared (one shared toolset, a binding per
  rollout), and the shared server under ``--concurrency`` rollouts at once.
- ``box``: the real box path, a ``bwrap`` box calling the host-side server: with the host's
  network (loopback) and without network (through the unix-socket bridge ``Runtime.host_url``
  sets up, the interception's own way in), against the same client on the host.
- ``frameworks``: vfray's app (the official SDK's low-level ``Server``) vs the SDK's decorator
  server ``MCPServer`` (FastMCP until mcp 2.0) vs the standalone ``fastmcp`` package (run from
  ``--fastmcp-python``, a virtualenv of its own, when given), all stateless JSON.
- ``ray``: a shared toolset on Ray served by a ``ToolsetNode`` actor's own listener vs the same
  app as a Serve deployment behind Serve's HTTP proxy, and the actor's bind+unbind per rollout.

Servers run in processes of their own; the client is the bash harness's stdlib MCP client
(``chat_loop.McpClient``, a new HTTP connection per call), in threads of this process.

    python benchmarks/tools.py [--calls 300] [--concurrency 256] [--parts placement,box,...]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import pickle
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.fixtures.tool_sets import Faulty as Echo  # noqa: E402  (importable in the box)
from vfray.tools import Scope  # noqa: E402

CHAT_LOOP = ROOT / "vfray" / "harnesses" / "programs" / "chat_loop.py"
CLIENT = """
import importlib.util, json, sys, time
spec = importlib.util.spec_from_file_location("chat_loop", sys.argv[1])
mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
client = mod.McpClient("b", sys.argv[2], 30); client.start()
out = []
for i in range(int(sys.argv[3])):
    t = time.perf_counter()
    assert client.call("fine", {"x": i}) == str(2 * i)
    out.append(time.perf_counter() - t)
print(json.dumps(out))
"""
"""The timed client as a script: run the same way on the host and inside a box."""


class SharedEcho(Echo):
    name = "shared_echo"
    scope = Scope.SHARED


def _client_module():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("chat_loop", CHAT_LOOP)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def _serve_host(bindings: int) -> None:
    from vfray.tools._mcp_app import Binding
    from vfray.tools.host import host_server

    server = host_server()
    own = await server.bind(Binding(server="echo", toolset=Echo()))
    urls = [await server.bind_shared(SharedEcho()) for _ in range(bindings)]
    print(json.dumps({"host": own, "shared": urls}), flush=True)
    await asyncio.Event().wait()


def _percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return ordered[len(ordered) // 2] * 1000, ordered[max(int(len(ordered) * 0.99) - 1, 0)] * 1000


def _timed_calls(client_cls, url: str, n: int) -> list[float]:  # type: ignore[no-untyped-def]
    client = client_cls("b", url, 30)
    client.start()
    out = []
    for i in range(n):
        t = time.perf_counter()
        assert client.call("fine", {"x": i}) == str(2 * i)
        out.append(time.perf_counter() - t)
    return out


def _rate(client_cls, urls: list[str], per: int) -> tuple[list[float], float]:  # type: ignore[no-untyped-def]
    """Every url's ``per`` calls at once (a thread each): the samples and calls/s."""
    started = time.perf_counter()
    with ThreadPoolExecutor(len(urls)) as pool:
        results = list(pool.map(lambda u: _timed_calls(client_cls, u, per), urls))
    wall = time.perf_counter() - started
    return [s for r in results for s in r], len(urls) * per / wall


def _table(title: str, rows: dict[str, list[float]], base: str) -> None:
    print(f"\n{title}")
    print(f"{'':40} {'p50 ms':>8} {'p99 ms':>8} {'p50 vs ' + base[:14]:>22}")
    ref = statistics.median(rows[base])
    for name, samples in rows.items():
        p50, p99 = _percentiles(samples)
        print(f"{name:40} {p50:8.2f} {p99:8.2f} {statistics.median(samples) / ref:21.2f}x")


def _popen(argv: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env)


def _placement(args: argparse.Namespace, urls: dict[str, Any], env: dict[str, str]) -> None:
    tmp = Path(tempfile.mkdtemp())
    (tmp / "spec.pkl").write_bytes(pickle.dumps(Echo()))
    box = _popen(
        [sys.executable, "-m", "vfray.tools._box", str(tmp / "spec.pkl"), str(tmp / "log")], env
    )
    try:
        assert box.stdout
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
        samples, rate = _rate(client, urls["shared"], per)
        rows[f"shared (c={args.concurrency})"] = samples
        _table("placement", rows, "in-box (loopback)")
        print(
            f"shared at c={args.concurrency}: {rate:.0f} calls/s "
            f"(client threads in one process, {threading.active_count()} threads left)"
        )
    finally:
        box.terminate()
        box.wait(5)


async def _in_box(url: str, calls: int, network: bool) -> list[float]:
    from vfray.runtimes.base import RuntimeSpec
    from vfray.runtimes.registry import make_runtime

    allow = ("*",) if network else ()
    runtime = make_runtime("bwrap", RuntimeSpec(network_allow=allow), ro_binds=[str(ROOT)])
    await runtime.start()
    try:
        seen = await runtime.host_url(url)
        await runtime.prepare_execution([seen])
        await runtime.write("client.py", CLIENT.encode())
        done = await runtime.run(
            ["python3", "client.py", str(CHAT_LOOP), seen, str(calls)], timeout=300
        )
        if not done.ok:
            raise RuntimeError(f"the in-box client failed: {done.stderr[-2000:]}")
        samples: list[float] = json.loads(done.stdout)
        return samples
    finally:
        await runtime.stop()


def _box(args: argparse.Namespace, urls: dict[str, Any]) -> None:
    if shutil.which("bwrap") is None:
        print("\nbox: skipped (bubblewrap is not installed)")
        return
    script = Path(tempfile.mkdtemp()) / "client.py"
    script.write_text(CLIENT)
    rows: dict[str, list[float]] = {}
    # Interleaved rounds: the machine's load moves between them, not between the rows.
    for _ in range(args.rounds):
        host = subprocess.run(
            [sys.executable, str(script), str(CHAT_LOOP), urls["host"], str(args.calls)],
            capture_output=True,
            text=True,
            check=True,
        )
        rows.setdefault("host process, no box", []).extend(json.loads(host.stdout))
        for name, network in (
            ("bwrap box, host network (loopback)", True),
            ("bwrap box, no network (bridge)", False),
        ):
            samples = asyncio.run(_in_box(urls["host"], args.calls, network=network))
            rows.setdefault(name, []).extend(samples)
    _table(
        "box path to a host-side server (the interception's way in)", rows, "host process, no box"
    )


def _frameworks(args: argparse.Namespace, urls: dict[str, Any], env: dict[str, str]) -> None:
    helper = str(ROOT / "benchmarks" / "_mcp_frameworks.py")
    # name -> (python, the helper's kind); None: vfray's own app, in the host-side server.
    servers: dict[str, tuple[str, str] | None] = {
        "vfray app (low-level Server)": None,
        "SDK low-level Server, bare": (sys.executable, "lowlevel"),
        "SDK MCPServer (ex-FastMCP)": (sys.executable, "mcpserver"),
    }
    if args.fastmcp_python:
        servers["fastmcp package"] = (args.fastmcp_python, "fastmcp")
    procs: list[subprocess.Popen[str]] = []
    client = _client_module().McpClient
    rows: dict[str, list[float]] = {}
    rates: dict[str, list[float]] = {}
    try:
        where: dict[str, str] = {}
        for name, how in servers.items():
            if how is None:
                where[name] = urls["host"]
                continue
            python, kind = how
            proc = _popen(
                [python, helper, kind],
                {**env, "PYTHONPATH": "", "FASTMCP_LOG_LEVEL": "WARNING"},
            )
            procs.append(proc)
            assert proc.stdout
            where[name] = f"http://127.0.0.1:{proc.stdout.readline().split()[-1]}/mcp"
        # Interleaved rounds: the machine's load moves between them, not between the rows.
        for _ in range(args.rounds):
            for name, url in where.items():
                rows.setdefault(name, []).extend(_timed_calls(client, url, args.calls))
                _, rate = _rate(client, [url] * 16, max(args.calls // 16, 20))
                rates.setdefault(name, []).append(rate)
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(5)
    base = next(iter(rows))
    _table("MCP server frameworks (stateless JSON, same client)", rows, base)
    ref = statistics.median(rates[base])
    for name, per_round in rates.items():
        rate = statistics.median(per_round)
        print(
            f"{name:40} {rate:8.0f} calls/s at c=16, median of {len(per_round)} rounds "
            f"({rate / ref:.2f}x)"
        )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _serve_asgi() -> Any:
    """The tool app with one shared binding, as a Serve replica builds it."""
    from vfray.tools._mcp_app import Binding, build_app

    binding = Binding(server="shared_echo", toolset=SharedEcho())
    return build_app(lambda token: binding if token == "bench" else None)


def _ray(args: argparse.Namespace) -> None:
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    import ray
    from ray import serve

    from actors import cluster
    from actors.toolset_node import ToolsetNode

    started = cluster.connect(num_cpus=2)
    client = _client_module().McpClient
    rows: dict[str, list[float]] = {}
    rates: dict[str, float] = {}
    try:
        node = ray.remote(ToolsetNode).options(num_cpus=0, max_concurrency=10_000).remote()
        url = ray.get(node.bind_shared.remote(SharedEcho()))
        ray.get(node.calls.remote(url))
        pairs = []
        for _ in range(50):
            t = time.perf_counter()
            extra = ray.get(node.bind_shared.remote(SharedEcho()))
            ray.get(node.calls.remote(extra))
            ray.get(node.unbind.remote(extra))
            pairs.append(time.perf_counter() - t)
        rows["ToolsetNode actor, own listener"] = _timed_calls(client, url, args.calls)
        _, rates["ToolsetNode actor, own listener"] = _rate(
            client, [url] * 16, max(args.calls // 16, 20)
        )
        port = _free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        app = serve.deployment(num_replicas=1, ray_actor_options={"num_cpus": 0})(
            serve.ingress(_serve_asgi)()
        )
        serve.run(app.bind(), name="tools", route_prefix="/")
        serve_url = f"http://127.0.0.1:{port}/mcp/bench"
        rows["Serve deployment, HTTP proxy"] = _timed_calls(client, serve_url, args.calls)
        _, rates["Serve deployment, HTTP proxy"] = _rate(
            client, [serve_url] * 16, max(args.calls // 16, 20)
        )
        serve.shutdown()
    finally:
        if started:
            ray.shutdown()
    _table("shared toolset on Ray: one per node", rows, "ToolsetNode actor, own listener")
    base = rates["ToolsetNode actor, own listener"]
    for name, rate in rates.items():
        print(f"{name:40} {rate:8.0f} calls/s at c=16 ({rate / base:.2f}x)")
    p50, p99 = _percentiles(pairs)
    print(
        f"actor bind + calls + unbind per rollout (3 RPCs from the caller): p50 {p50:.2f} ms, "
        f"p99 {p99:.2f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per part")
    parser.add_argument("--parts", default="placement,box,frameworks,ray")
    parser.add_argument("--fastmcp-python", default=None, help="a python with `fastmcp`")
    parser.add_argument("--serve-host", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_host:
        asyncio.run(_serve_host(args.serve_host))
        return
    parts = set(args.parts.split(","))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    host = _popen([sys.executable, __file__, "--serve-host", str(args.concurrency)], env)
    try:
        assert host.stdout
        urls = json.loads(host.stdout.readline())
        if "placement" in parts:
            _placement(args, urls, env)
        if "box" in parts:
            _box(args, urls)
        if "frameworks" in parts:
            _frameworks(args, urls, env)
    finally:
        host.terminate()
        host.wait(5)
    if "ray" in parts:
        _ray(args)


if __name__ == "__main__":
    main()
