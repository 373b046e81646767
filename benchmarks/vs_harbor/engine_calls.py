"""What vfray asks of the Docker engine per trial: ``vfray eval harbor:PATH`` with the oracle on
the docker runtime (benchmarks/vs_harbor/tasks), through a counting proxy on the engine's
socket, and the engine's CPU per trial (this engine's dockerd, its containerd and shims only).

    python benchmarks/vs_harbor/engine_calls.py [--attempts 2] [--concurrent 4]

A private dockerd (tests/docker_engine.py) is started here; one untimed run first builds the
task images. Prints the API calls per trial by kind (method and path, ids folded) and one JSON
line with the totals, for a before/after comparison of a change to the docker runtime.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import re
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from benchmarks.vs_harbor import common  # noqa: E402

REQUEST = re.compile(rb"(GET|POST|PUT|DELETE|HEAD) (/v[\d.]+)?(/[^ ?]*)[^ ]* HTTP/1\.[01]\r\n")
CMD = re.compile(rb'"Cmd": \[(.*?)\]')
ID = re.compile(r"/[0-9a-f]{12,64}(?=/|$)")


class CountingProxy:
    """A unix socket relaying every connection to the engine's, counting the HTTP requests
    the client side sends (their method and path, ids folded to ``{id}``)."""

    def __init__(self, engine_socket: str, path: str) -> None:
        self.engine_socket, self.path = engine_socket, path
        self.counts: collections.Counter[str] = collections.Counter()
        self.execs: collections.Counter[str] = collections.Counter()
        """The commands of the execs created, by their first 70 characters."""
        self.loop = asyncio.new_event_loop()

    async def _pump(
        self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, count: bool
    ) -> None:
        try:
            while chunk := await src.read(65536):
                if count:
                    for m in REQUEST.finditer(chunk):
                        route = ID.sub("/{id}", m.group(3).decode())
                        self.counts[f"{m.group(1).decode()} {route}"] += 1
                    for cmd in CMD.finditer(chunk):
                        self.execs[cmd.group(1).decode(errors="replace")[:70]] += 1
                dst.write(chunk)
                await dst.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                dst.write_eof() if dst.can_write_eof() else dst.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_unix_connection(self.engine_socket)
        await asyncio.gather(self._pump(reader, up_w, True), self._pump(up_r, writer, False))
        writer.close()
        up_w.close()

    @contextlib.contextmanager
    def running(self) -> Iterator[str]:
        started = threading.Event()

        def serve() -> None:
            asyncio.set_event_loop(self.loop)
            server = self.loop.run_until_complete(asyncio.start_unix_server(self._serve, self.path))
            started.set()
            self.loop.run_forever()
            server.close()

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        started.wait()
        try:
            yield f"unix://{self.path}"
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            thread.join(5)


def run_vfray(
    url: str, attempts: int, concurrent: int, root: Path = ROOT, harness: str = "oracle"
) -> int:
    options = json.dumps({"base_url": url, "build_network": "host"})
    with tempfile.TemporaryDirectory(prefix="vfray-engine-calls-") as tmp:
        argv = [
            sys.executable, "-m", "vfray", "eval", f"harbor:{common.TASKS}", "--harness", harness,
            "-m", "scripted:echo" if harness == "oracle" else "scripted:agent",
            "--runtime", "docker", "--env.runtime.options", options,
            "-o", str(Path(tmp) / "out"), "--backend", "local", "-r", str(attempts),
            "-c", str(concurrent), "--no-progress",
        ]  # fmt: skip
        run = common.measured_run(argv, None, root)
        if run.returncode:
            raise RuntimeError(f"vfray eval failed: {run.output}")
    return attempts * len([p for p in common.TASKS.iterdir() if p.is_dir()])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--attempts", type=int, default=2)
    parser.add_argument("--concurrent", type=int, default=4)
    parser.add_argument(
        "--roots",
        default=str(ROOT),
        help="comma-separated vfray source trees to run in turn (a before/after pair: e.g. "
        "`git archive HEAD~1 | tar -x -C /tmp/before`), each measured on the same engine",
    )
    parser.add_argument("--rounds", type=int, default=1, help="times through --roots")
    parser.add_argument("--harness", default="oracle", help="oracle, codex, claude-code, ...")
    args = parser.parse_args()
    from docker_engine import docker_engine

    from vfray.runtimes import debian_image

    with docker_engine() as engine, tempfile.TemporaryDirectory() as tmp:
        base = debian_image.build(Path("/var/cache/vfray-ci/images"))
        debian_image.import_into_docker(base, engine)
        common.build_bench_image(engine)
        socket_path = engine.removeprefix("unix://")
        run_vfray(engine, 1, args.concurrent, harness=args.harness)  # untimed: builds images
        for n in range(args.rounds * len(args.roots.split(","))):
            root = Path(args.roots.split(",")[n % len(args.roots.split(","))])
            proxy = CountingProxy(socket_path, str(Path(tmp) / f"proxy{n}.sock"))
            with proxy.running() as url:
                before = common.engine_cpu(engine)
                trials = run_vfray(url, args.attempts, args.concurrent, root, args.harness)
                cpu = common.engine_cpu(engine) - before
            report(root, proxy, trials, cpu)


def report(root: Path, proxy: CountingProxy, trials: int, cpu: float) -> None:
    print(f"== {root}: engine API calls per trial by kind")
    for route, n in proxy.counts.most_common():
        print(f"{n / trials:8.2f}  {route}")
    print("execs per trial by command:")
    for cmd, n in proxy.execs.most_common(20):
        print(f"{n / trials:8.2f}  {cmd}")
    print(json.dumps({
        "root": str(root),
        "trials": trials,
        "api_calls_per_trial": round(sum(proxy.counts.values()) / trials, 2),
        "engine_cpu_per_trial_s": round(cpu / trials, 3),
        "load_1min": round(psutil.getloadavg()[0], 1),
    }), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
