"""Egress benchmark: the ways to give a box some hosts and not others, measured side by side.

Run as root: ``python benchmarks/egress.py [--requests 200] [--boxes 20]``. It makes a network
namespace behind a veth (the "internet": an HTTP server on one of its addresses; nothing leaves
the machine) and measures, from inside a bwrap box:

- a small GET p50/p90 (a fresh connection each), and a 64 MiB download, direct (a box that
  shares the node's network: no filtering at all) vs through the node's egress proxy
  (:mod:`vfray.runtimes.egress`, the agent phase with the host in ``network_allow``);
- ``run(["true"])`` p50 in a box with no network at all (no forwarder) vs a box with the proxy
  (every run goes through the bridge's forwarder);
- per box: opening and closing a gate on the proxy vs the alternative, rules in a network
  namespace of the box's own (``ip netns add``, a veth pair, addresses, 4 iptables rules,
  ``ip netns del``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from vfray.runtimes.base import RuntimeSpec
from vfray.runtimes.bridge import BridgeSet
from vfray.runtimes.bwrap import BwrapRuntime
from vfray.runtimes.egress import open_gate
from vfray.runtimes.network_policy import box_network

PORT = 8080
CLIENT = r"""
import sys, time, urllib.request
url, n, big = sys.argv[1], int(sys.argv[2]), sys.argv[3]
opener = urllib.request.build_opener()  # proxies from the environment, as any client
times = []
for _ in range(n):
    t = time.perf_counter()
    opener.open(url, timeout=30).read()
    times.append(time.perf_counter() - t)
times.sort()
t = time.perf_counter()
size = len(opener.open(big, timeout=120).read())
dt = time.perf_counter() - t
print(times[len(times) // 2] * 1000, times[int(len(times) * 0.9)] * 1000, size / dt / 1e9)
"""


def _sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


@contextlib.contextmanager
def far_host() -> Iterator[str]:
    tag = uuid.uuid4().hex[:6]
    ns, host_end, far_end = f"vfbe-{tag}", f"vfbh{tag}", f"vfbf{tag}"
    net = f"10.215.{int(tag[:2], 16) % 200 + 20}"
    root = Path(tempfile.mkdtemp(prefix="vfray-egress-bench-"))
    (root / "small").write_bytes(b"x" * 512)
    (root / "big").write_bytes(b"y" * (64 << 20))
    _sh("ip", "netns", "add", ns)
    server = None
    try:
        _sh("ip", "link", "add", host_end, "type", "veth", "peer", "name", far_end)
        _sh("ip", "link", "set", far_end, "netns", ns)
        _sh("ip", "addr", "add", f"{net}.1/24", "dev", host_end)
        _sh("ip", "link", "set", host_end, "up")
        _sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{net}.2/24", "dev", far_end)
        _sh("ip", "netns", "exec", ns, "ip", "link", "set", far_end, "up")
        server = subprocess.Popen(
            [*("ip", "netns", "exec", ns, sys.executable, "-m", "http.server", str(PORT)),
             *("--bind", f"{net}.2", "--directory", str(root))],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        for _ in range(200):
            try:
                socket.create_connection((f"{net}.2", PORT), 1).close()
                break
            except OSError:
                time.sleep(0.05)
        yield f"{net}.2"
    finally:
        if server is not None:
            server.terminate()
            server.wait()
        with contextlib.suppress(subprocess.CalledProcessError):
            _sh("ip", "link", "del", host_end)
        _sh("ip", "netns", "del", ns)
        shutil.rmtree(root, ignore_errors=True)


async def fetches(rt: BwrapRuntime, host: str, n: int) -> list[float]:
    url, big = f"http://{host}:{PORT}/small", f"http://{host}:{PORT}/big"
    done = await rt.run([sys.executable, "-c", CLIENT, url, str(n), big], timeout=600)
    assert done.ok, done
    return [float(x) for x in done.stdout.split()]


async def true_p50(rt: BwrapRuntime, n: int) -> float:
    times = []
    for _ in range(n):
        started = time.perf_counter()
        assert (await rt.run(["true"], timeout=60)).ok
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


async def gate_cycle(n: int) -> float:
    network = box_network(["10.0.0.1"], [], None)
    times = []
    for _ in range(n):
        with tempfile.TemporaryDirectory() as d:
            bridges = BridgeSet(Path(d), "/run/vfray-bridge")
            started = time.perf_counter()
            await open_gate(network, bridges, "bench")
            await bridges.close()
            times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def netns_cycle(n: int) -> float:
    times = []
    for i in range(n):
        tag = f"{uuid.uuid4().hex[:6]}"
        ns, a, b = f"vfbn-{tag}", f"vfna{tag}", f"vfnb{tag}"
        started = time.perf_counter()
        _sh("ip", "netns", "add", ns)
        _sh("ip", "link", "add", a, "type", "veth", "peer", "name", b)
        _sh("ip", "link", "set", b, "netns", ns)
        _sh("ip", "addr", "add", f"10.216.{i % 250}.1/30", "dev", a)
        _sh("ip", "link", "set", a, "up")
        ex = ("ip", "netns", "exec", ns)
        _sh(*ex, "ip", "addr", "add", f"10.216.{i % 250}.2/30", "dev", b)
        _sh(*ex, "ip", "link", "set", b, "up")
        _sh(*ex, "iptables", "-P", "OUTPUT", "DROP")
        _sh(*ex, "iptables", "-A", "OUTPUT", "-o", "lo", "-j", "ACCEPT")
        _sh(*ex, "iptables", "-A", "OUTPUT", "-d", "10.0.0.1", "-j", "ACCEPT")
        _sh(*ex, "iptables", "-A", "OUTPUT", "-d", "10.0.0.2", "-j", "ACCEPT")
        _sh("ip", "link", "del", a)
        _sh("ip", "netns", "del", ns)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--boxes", type=int, default=20)
    args = parser.parse_args()
    with far_host() as host:
        async with BwrapRuntime(RuntimeSpec(), share_network=True) as direct:
            d50, d90, dbw = await fetches(direct, host, args.requests)
        async with BwrapRuntime(RuntimeSpec(network_allow=(host,))) as proxied:
            await proxied.prepare_execution([])
            p50, p90, pbw = await fetches(proxied, host, args.requests)
            with_proxy = await true_p50(proxied, 50)
        async with BwrapRuntime(RuntimeSpec(), share_network=False) as offline:
            without = await true_p50(offline, 50)
    gate = await gate_cycle(args.boxes)
    iptables = netns_cycle(args.boxes) if shutil.which("iptables") else float("nan")
    print(f"small GET p50/p90, direct:     {d50:.2f} / {d90:.2f} ms")
    print(f"small GET p50/p90, proxy:      {p50:.2f} / {p90:.2f} ms ({p50 / d50:.1f}x)")
    print(f"64 MiB download, direct:       {dbw:.2f} GB/s")
    print(f"64 MiB download, proxy:        {pbw:.2f} GB/s ({pbw / dbw:.2f}x)")
    print(f"run(['true']) p50, no network: {without:.1f} ms")
    print(f"run(['true']) p50, proxy:      {with_proxy:.1f} ms (+{with_proxy - without:.1f} ms)")
    print(f"per box, gate open+close:      {gate:.2f} ms")
    print(f"per box, netns+veth+iptables:  {iptables:.1f} ms ({iptables / gate:.0f}x)")


if __name__ == "__main__":
    asyncio.run(main())
