"""Interception throughput and added latency: N concurrent sessions doing chat turns.

Three processes: the scripted model (zero latency), a proxy, and this load generator. Proxies:
``direct`` (none: the baseline for added latency), ``bare-httpx`` and ``bare-aiohttp`` (a
pass-through that forwards bytes with one shared client and records nothing: this also picks
the forwarder's client library), and ``vfray`` (the real InterceptionApp: auth, limits, parse,
record). Prints turns/s, p50/p99 latency added over ``direct``, and the ratio vfray / bare.

    python benchmarks/interception.py            # ~2 minutes
    python benchmarks/interception.py --quick    # ~30 seconds
    python benchmarks/interception.py --turns 50 # episodes of 50 turns instead of 8
    python benchmarks/interception.py --growth   # proxy CPU per turn vs episode length (~1 min)
    python benchmarks/interception.py --sweep    # added p50/p99 at 64-2000 sessions (~2 min)
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
import time
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parent.parent


# -- the served processes --------------------------------------------------------------------


def _bare_app(upstream: str, library: str) -> Any:
    """A pass-through proxy: same routes, bytes in, bytes out, nothing parsed or recorded."""
    import httpx

    state: dict[str, Any] = {}

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        url = upstream + scope["path"].removeprefix("/v1")
        headers = {"content-type": "application/json"}
        if library == "httpx":
            client = state.setdefault("client", httpx.AsyncClient(timeout=60))
            response = await client.post(url, content=b"".join(chunks), headers=headers)
            status, body = response.status_code, response.content
        else:
            if "client" not in state:
                connector = aiohttp.TCPConnector(limit=4096, limit_per_host=4096)
                state["client"] = aiohttp.ClientSession(connector=connector)
            async with state["client"].post(url, data=b"".join(chunks), headers=headers) as r:
                status, body = r.status, await r.read()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": body})

    async def aclose() -> None:
        if "client" in state:
            await (state["client"].aclose() if library == "httpx" else state["client"].close())

    app.aclose = aclose  # type: ignore[attr-defined]
    return app


async def _serve(kind: str, upstream: str, sessions: int, latency: float = 0.0) -> None:
    from vfray.endpoints.serving import serve_in_loop
    from vfray.interception import InterceptionApp, Upstream
    from vfray.models.scripted.server import ScriptedModel
    from vfray.trace import TaskRecord, Trace

    secrets: list[str] = []
    app: Any
    if kind == "model":
        app = ScriptedModel("echo", latency=latency, history_size=1)
    elif kind == "vfray":
        app = InterceptionApp(Upstream(upstream, model="bench", sampling={"temperature": 0.0}))
        secrets = [
            app.register(Trace(task=TaskRecord(key=str(i), hash="h"))) for i in range(sessions)
        ]
    else:
        app = _bare_app(upstream, kind.removeprefix("bare-"))
    async with serve_in_loop(app, timeout_keep_alive=600) as url:
        print(json.dumps({"url": url, "secrets": secrets}), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    if kind != "model":
        await app.aclose()


class Served:
    def __init__(
        self, kind: str, upstream: str = "", sessions: int = 0, latency: float = 0.0
    ) -> None:
        argv = [sys.executable, __file__, "--serve", kind, "--upstream", upstream]
        self.proc = subprocess.Popen(
            [*argv, "--sessions", str(sessions), "--latency", str(latency)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert self.proc.stdout is not None
        info = json.loads(self.proc.stdout.readline())
        self.url: str = info["url"]
        self.secrets: list[str] = info["secrets"]

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()  # the server exits when its stdin closes
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# -- the load ---------------------------------------------------------------------------------


async def _load(
    url: str, secrets: list[str], sessions: int, seconds: float, turns: int
) -> dict[str, float]:
    latencies: list[float] = []
    errors = 0
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:
        measuring = False
        deadline = 0.0

        async def session(i: int) -> None:
            nonlocal errors
            headers = {"authorization": f"Bearer {secrets[i] if secrets else 'x'}"}
            messages: list[dict[str, Any]] = []
            while not measuring or time.perf_counter() < deadline:
                if len(messages) >= 2 * turns:  # an episode of `turns` turns, then a fresh one
                    messages = []
                messages.append({"role": "user", "content": f"session {i} turn {len(messages)}"})
                body = {"model": "m", "messages": messages}
                start = time.perf_counter()
                async with http.post(f"{url}/v1/chat/completions", json=body, headers=headers) as r:
                    data = await r.json()
                if r.status != 200:
                    errors += 1
                    continue
                if measuring:
                    latencies.append(time.perf_counter() - start)
                messages.append(data["choices"][0]["message"])

        tasks = [asyncio.create_task(session(i)) for i in range(sessions)]
        await asyncio.sleep(min(1.0, seconds / 3))  # warm up connections and sessions
        measuring, deadline = True, time.perf_counter() + seconds
        began = time.perf_counter()
        await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - began
    latencies.sort()
    return {
        "turns_s": len(latencies) / elapsed,
        "p50": latencies[len(latencies) // 2] * 1000,
        "p99": latencies[int(len(latencies) * 0.99)] * 1000,
        "mean": statistics.fmean(latencies) * 1000,
        "errors": errors,
    }


def _run(kind: str, model_url: str, sessions: int, seconds: float, turns: int) -> dict[str, float]:
    if kind == "direct":
        return asyncio.run(_load(model_url, [], sessions, seconds, turns))
    proxy = Served(kind, f"{model_url}/v1", sessions)
    try:
        return asyncio.run(_load(proxy.url, proxy.secrets, sessions, seconds, turns))
    finally:
        proxy.close()


# -- cost per turn as conversations grow ------------------------------------------------------

GROWTH_LENGTHS = (8, 25, 50, 100)
GROWTH_TURNS_PER_SESSION = 200
FILLER = " lorem" * 80  # ~500-character messages, the size of a short tool output


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (Linux ``/proc``): unlike wall time, barely moved
    by whatever else a shared machine is running."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _episodes(url: str, secrets: list[str], turns: int, episodes: int) -> list[float]:
    """Every session plays ``episodes`` whole conversations of ``turns`` turns; the latencies."""
    latencies: list[float] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:

        async def session(i: int) -> None:
            headers = {"authorization": f"Bearer {secrets[i]}"}
            for episode in range(episodes):
                messages: list[dict[str, Any]] = []
                for turn in range(turns):
                    text = f"session {i} episode {episode} turn {turn}:{FILLER}"
                    messages.append({"role": "user", "content": text})
                    body = {"model": "m", "messages": messages}
                    start = time.perf_counter()
                    async with http.post(
                        f"{url}/v1/chat/completions", json=body, headers=headers
                    ) as r:
                        data = await r.json()
                    latencies.append(time.perf_counter() - start)
                    messages.append(data["choices"][0]["message"])

        await asyncio.gather(*(session(i) for i in range(len(secrets))))
    return latencies


def _recording_cpu(turns: int) -> float:
    """CPU seconds per turn of the recording path alone, in this process: a session's request
    parsed (through its cache of parsed history) and recorded on its trace, as the proxy does."""
    from vfray.interception.dialects import DIALECTS
    from vfray.interception.sessions import SessionRegistry
    from vfray.trace import Message, TaskRecord, Trace

    chat, registry = DIALECTS["chat"], SessionRegistry()
    trace = Trace(task=TaskRecord(key="k", hash="h"))
    session = registry.lookup(registry.register(trace))
    assert session is not None
    messages: list[dict[str, Any]] = []
    spent = 0.0
    for turn in range(turns):
        messages.append({"role": "user", "content": f"turn {turn}:{FILLER}"})
        body = json.loads(json.dumps({"model": "m", "messages": messages}))
        reply = Message(role="assistant", content=f"reply {turn}:{FILLER}")
        start = time.process_time()
        parsed = chat.parse_request(body, session.parsed)
        trace.record_call(parsed.messages, reply)
        spent += time.process_time() - start
        messages.append(reply.model_dump(exclude_none=True))
    return spent / turns


def _growth(model_url: str, sessions: int) -> None:
    print(
        f"\nvfray proxy, {sessions} sessions x {GROWTH_TURNS_PER_SESSION} turns each, "
        f"~{len(FILLER)}-character messages, scripted model at zero latency; proxy CPU is the "
        f"proxy process's, parse+record the recording path alone (in this process)"
    )
    print(
        f"{'turns/episode':>14}{'turns/s':>10}{'p50 ms':>9}{'proxy CPU us/turn':>19}"
        f"{'parse+record us/turn':>22}"
    )
    for turns in GROWTH_LENGTHS:
        episodes = max(1, GROWTH_TURNS_PER_SESSION // turns)
        proxy = Served("vfray", f"{model_url}/v1", sessions)
        try:
            cpu = _cpu_seconds(proxy.proc.pid)
            began = time.perf_counter()
            latencies = asyncio.run(_episodes(proxy.url, proxy.secrets, turns, episodes))
            elapsed = time.perf_counter() - began
            cpu = _cpu_seconds(proxy.proc.pid) - cpu
        finally:
            proxy.close()
        recording = min(_recording_cpu(turns) for _ in range(3))
        latencies.sort()
        print(
            f"{turns:>14}{len(latencies) / elapsed:>10.0f}"
            f"{latencies[len(latencies) // 2] * 1000:>9.2f}{cpu / len(latencies) * 1e6:>19.0f}"
            f"{recording * 1e6:>22.0f}"
        )


# -- added latency as concurrency grows ---------------------------------------------------------

SWEEP_LEVELS = (64, 256, 1000, 2000)
SWEEP_TURNS = 3
SWEEP_LEVEL_TIMEOUT = 180.0


def _raise_fd_limit() -> None:
    # Each session holds a socket in the client, two in the proxy and one in the model.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = 1 << 20
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


async def _sessions_of_turns(
    url: str, secrets: list[str], sessions: int, turns: int
) -> tuple[list[float], int]:
    """``sessions`` concurrent conversations of ``turns`` turns each (every session opens its
    own connection, as a harness program does); the turn latencies and the failures."""
    latencies: list[float] = []
    failures = 0
    timeout = aiohttp.ClientTimeout(total=SWEEP_LEVEL_TIMEOUT)
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=timeout
    ) as http:

        async def session(i: int) -> None:
            nonlocal failures
            headers = {"authorization": f"Bearer {secrets[i] if secrets else 'x'}"}
            messages: list[dict[str, Any]] = []
            for turn in range(turns):
                messages.append({"role": "user", "content": f"session {i} turn {turn}"})
                body = {"model": "m", "messages": messages}
                start = time.perf_counter()
                try:
                    async with http.post(
                        f"{url}/v1/chat/completions", json=body, headers=headers
                    ) as r:
                        data = await r.json()
                    ok = r.status == 200
                except (TimeoutError, aiohttp.ClientError):
                    ok = False
                if not ok:
                    failures += 1
                    return
                latencies.append(time.perf_counter() - start)
                messages.append(data["choices"][0]["message"])

        await asyncio.gather(*(session(i) for i in range(sessions)))
    return latencies, failures


def _percentiles(latencies: list[float]) -> tuple[float, float]:
    if not latencies:
        return float("nan"), float("nan")
    ordered = sorted(latencies)
    return ordered[len(ordered) // 2], ordered[int(0.99 * (len(ordered) - 1))]


def _sweep(levels: list[int], latency: float, turns: int) -> None:
    """Per concurrency level: the same sessions straight to the model, then through the proxy
    (a fresh proxy process per level, its sessions registered up front)."""
    _raise_fd_limit()
    model = Served("model", latency=latency)
    print(
        f"\n{turns} turns per session, all sessions at once, scripted model at {latency:g} s; "
        f"direct = straight to the model, vfray = through the interception; latency in ms"
    )
    print(
        f"{'sessions':>9}{'direct p50':>11}{'direct p99':>11}{'vfray p50':>10}{'vfray p99':>10}"
        f"{'+p50':>8}{'+p99':>8}{'errors':>8}{'proxy CPU ms/turn':>19}"
    )
    try:
        for sessions in levels:
            direct, direct_failed = asyncio.run(_sessions_of_turns(model.url, [], sessions, turns))
            proxy = Served("vfray", f"{model.url}/v1", sessions)
            try:
                cpu = _cpu_seconds(proxy.proc.pid)
                ours, ours_failed = asyncio.run(
                    _sessions_of_turns(proxy.url, proxy.secrets, sessions, turns)
                )
                cpu = _cpu_seconds(proxy.proc.pid) - cpu
            finally:
                proxy.close()
            (d50, d99), (v50, v99) = _percentiles(direct), _percentiles(ours)
            print(
                f"{sessions:>9}{d50 * 1e3:>11.0f}{d99 * 1e3:>11.0f}{v50 * 1e3:>10.0f}"
                f"{v99 * 1e3:>10.0f}{(v50 - d50) * 1e3:>8.0f}{(v99 - d99) * 1e3:>8.0f}"
                f"{direct_failed + ours_failed:>8}{cpu / max(1, len(ours)) * 1e3:>19.2f}",
                flush=True,
            )
    finally:
        model.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter runs (about 30 s)")
    parser.add_argument("--turns", type=int, default=8, help="turns per episode (default 8)")
    parser.add_argument(
        "--growth", action="store_true", help="only: proxy CPU per turn vs episode length"
    )
    parser.add_argument(
        "--sweep", action="store_true", help="only: added p50/p99 per concurrency level"
    )
    parser.add_argument(
        "--levels",
        default=",".join(map(str, SWEEP_LEVELS)),
        help="sweep: concurrent sessions per level (default 64,256,1000,2000)",
    )
    parser.add_argument("--latency", type=float, default=1.0, help="sweep: model latency (s)")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--upstream", default="", help=argparse.SUPPRESS)
    parser.add_argument("--sessions", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(_serve(args.serve, args.upstream, args.sessions, args.latency))
        return
    if args.sweep:
        _sweep([int(n) for n in args.levels.split(",")], args.latency, SWEEP_TURNS)
        return
    seconds = 2.0 if args.quick else 8.0
    model = Served("model")
    if args.growth:
        try:
            _growth(model.url, 16)
        finally:
            model.close()
        return
    try:
        results: dict[tuple[str, int], dict[str, float]] = {}
        plan = [("direct", 64), ("bare-httpx", 64), ("bare-aiohttp", 64), ("vfray", 64)]
        plan += [("direct", 1024), ("bare-aiohttp", 1024), ("vfray", 1024)]
        for kind, sessions in plan:
            results[kind, sessions] = _run(kind, model.url, sessions, seconds, args.turns)
    finally:
        model.close()

    print(
        f"\nscripted model at zero latency, {seconds:.0f} s per row, non-streaming chat turns, "
        f"episodes of {args.turns} turns"
    )
    print(
        f"{'proxy':<14}{'sessions':>9}{'turns/s':>10}{'p50 ms':>9}{'p99 ms':>9}"
        f"{'+p50 ms':>9}{'+p99 ms':>9}{'errors':>8}"
    )
    for (kind, sessions), r in results.items():
        base = results["direct", sessions]
        print(
            f"{kind:<14}{sessions:>9}{r['turns_s']:>10.0f}{r['p50']:>9.2f}{r['p99']:>9.2f}"
            f"{r['p50'] - base['p50']:>9.2f}{r['p99'] - base['p99']:>9.2f}{r['errors']:>8.0f}"
        )
    print()
    httpx_rate, aiohttp_rate = (results[k, 64]["turns_s"] for k in ("bare-httpx", "bare-aiohttp"))
    print(f"forwarder: aiohttp / httpx throughput at 64 sessions = {aiohttp_rate / httpx_rate:.2f}")
    for sessions in (64, 1024):
        bare, ours = results["bare-aiohttp", sessions], results["vfray", sessions]
        print(
            f"{sessions:>5} sessions: vfray / bare throughput = "
            f"{ours['turns_s'] / bare['turns_s']:.2f}, p50 latency ratio = "
            f"{ours['p50'] / bare['p50']:.2f}"
        )


if __name__ == "__main__":
    main()
