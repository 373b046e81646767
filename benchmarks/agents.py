"""Agent-harness benchmark: the real agent programs (mini-swe-agent, Codex CLI, Claude Code) driven
by the scripted ``agent`` model through ``LocalEnvironment`` (no Ray), one task each: write a
file, check it, answer; the reward reads the file in the box.

Per harness it prints rollouts/s at each concurrency (``--concurrency 8,32``; ``--rollouts N``
per level, default one full wave: N = c), the peak RSS of the whole process tree (this process,
the interception, the scripted model and every agent program) while they run, and the first
rollout's wall time with the tool dir warm (``--tools-dir``, default ``$VFRAY_TOOLS_DIR``) and
cold (a fresh empty tool dir under /tmp, so that rollout's setup installs the program from
PyPI/npm with empty uv/npm caches), and how many connections the agents opened to the
interception per rollout (a program that opens one per call costs vfray an accept, a protocol
and a close each time). The load average is printed before and after: on a shared machine it
moves the figures more than anything measured here.

CPU per rollout (issue 30's goal: vfray's at most 5% of the agent's) is measured apart from the
scripted model, which runs in its own process (``vfray serve-model --policy agent``, not
counted): vfray's is this process's (the rollouts, the interception and every thread of them,
less the RSS sampler's thread); the agent's is the whole box process tree's, from a cgroup v1
``cpuacct`` group this process joins (its children inherit it; bwrap boxes join only memory,
cpu and pids) less this process's own. So the agent's figure holds the box's setup too (bwrap,
its join shell), and it holds everything however the box's processes end (a killed pid
namespace's processes are never reaped into this process's children's times). Without a
writable ``cpuacct`` hierarchy it falls back to the reaped children's times (subprocess only).

The rollouts run on uvloop, the loop vfray runs them on (``--loop asyncio``: asyncio's own),
with the collector thresholds the ``vfray`` command sets (``--gc python``: Python's).
``--by-task`` (with ``--loop asyncio``) prints where the event loop's CPU went per rollout, by
the task or transport each callback ran for: the interception's request tasks, the harness's
session, the box's start and stop.

Run: ``python benchmarks/agents.py [--harnesses mini-swe-agent,codex,claude-code]
[--runtime subprocess|bwrap] [--concurrency 8,32] [--rollouts N] [--no-cold] [--loop L]``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import http.server
import logging
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import psutil
from rollouts import tree_rss

import vfray as vf
from vfray.harnesses.swe_agent import UPSTREAM as SWE_AGENT_UPSTREAM
from vfray.interception.app import InterceptionApp
from vfray.owned_process import tune_owned_process
from vfray.runtimes.base import Runtime
from vfray.runtimes.provision import TOOLS_DIR_ENV

HARNESSES = (
    "mini-swe-agent",
    "codex",
    "claude-code",
    "pi",
    "qwen-code",
    "opencode",
    "terminus-2",
    "hermes-agent",
    "aider",
    "kimi-code",
    "goose",
    "browser-use",
    "openclaw",
    "gemini-cli",
    "openhands",
    "swe-agent",
    "claude-code-acp",
    "codex-acp",
    "bash",
)
PROMPT = 'Write "hello agent" to out.txt, then check it.'
SETUPS: dict[str, tuple[str, dict[str, Any]]] = {
    # Compaction after every tool step: three contexts (branches) and five calls a rollout.
    "compact": (PROMPT, {"compact_at": 1}),
    # One sub-call writes the file, the root checks it: two branches, six calls a rollout.
    "rlm": ('Ask: write "hello agent" to out.txt\nrun: cat out.txt', {}),
    # Not on PyPI: from a source tree or git URL (the default tag needs the internet).
    "swe-agent": (PROMPT, {"source": os.environ.get("VFRAY_SWE_AGENT_SOURCE", SWE_AGENT_UPSTREAM)}),
}
"""Prompt and harness options for the chat-loop harnesses whose own behaviour needs them (any
other harness: ``PROMPT``, no options). Run with ``--harnesses compact,rlm --no-cold``."""


class WriteFile(vf.Task[vf.TaskData]):
    """Solved when the box's out.txt holds the line the prompt asked for."""

    @vf.reward
    async def wrote_it(self, runtime: Runtime) -> bool:
        return (await runtime.read("out.txt")) == b"hello agent\n"


PAGE = b"""<!doctype html><title>Vault</title><h1>The vault</h1><button
onclick="document.getElementById('out').textContent='The code is KIWI-'+(6*7)">Reveal</button>
<p id="out"></p>"""


@functools.cache
def page_url() -> str:
    """browser-use's page, served by a thread of this process on 127.0.0.1: its code shows only
    after a click runs its JavaScript."""

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("content-type", "text/html")
            self.send_header("content-length", str(len(PAGE)))
            self.end_headers()
            self.wfile.write(PAGE)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}/"


class FindCode(WriteFile):
    """browser-use's task: solved when its final answer is the code the page reveals."""

    async def setup(self, trace: vf.Trace, runtime: Runtime) -> None:
        await runtime.host_url(page_url())  # the host's page, at the same URL in the box

    @vf.reward
    async def wrote_it(self, trace: vf.Trace) -> bool:  # type: ignore[override]
        return '"text": "KIWI-42"' in (trace.last_reply or "")


def tasks(count: int, runtime: str, harness: str = "") -> list[WriteFile]:
    # Not bwrap's default /work: a host venv under /work (this machine's) would be hidden.
    workdir = "/box" if runtime == "bwrap" else None
    prompt = SETUPS.get(harness, (PROMPT, {}))[0]
    if harness == "browser-use":
        prompt = f"open: {page_url()}\nclick: Reveal\nanswer: The code is (\\S+)"
    kind = FindCode if harness == "browser-use" else WriteFile
    return [
        kind(vf.TaskData(prompt=prompt, workdir=workdir), key=f"write-{i}") for i in range(count)
    ]


@contextmanager
def tools_dir(path: str) -> Iterator[None]:
    """``$VFRAY_TOOLS_DIR`` set to ``path`` for the harnesses made inside."""
    old = os.environ.get(TOOLS_DIR_ENV)
    os.environ[TOOLS_DIR_ENV] = path
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(TOOLS_DIR_ENV, None)
        else:
            os.environ[TOOLS_DIR_ENV] = old


def remove_tree(path: Path) -> None:
    """Remove a tool root (its finished tool dirs are read-only)."""
    for entry in [path, *path.rglob("*")]:
        if entry.is_dir() and not entry.is_symlink():
            entry.chmod(entry.stat().st_mode | stat.S_IWUSR | stat.S_IXUSR)
    shutil.rmtree(path, ignore_errors=True)


def failures(traces: list[vf.Trace]) -> str:
    bad = [t for t in traces if not t.ok or t.reward != 1.0]
    if not bad:
        return ""
    first = bad[0]
    why = first.errors[0].message[:200] if first.errors else f"reward {first.reward}"
    return f"{len(bad)} failed (e.g. {why})"


MODEL_URL: list[str] = []
"""The scripted model's base URL, served by its own process (set by :func:`scripted_model`)."""


@contextmanager
def scripted_model() -> Iterator[psutil.Process]:
    """``vfray serve-model --policy agent`` in its own process, so that its CPU is neither
    vfray's nor the agent's; yields that process."""
    argv = [sys.executable, "-m", "vfray.cli.serve_model", "--policy", "agent", "--port", "0"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if " serving at " not in line:
            raise SystemExit(f"the scripted model did not start: {line!r}")
        MODEL_URL[:] = [line.rsplit(" ", 1)[1].strip()]
        yield psutil.Process(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


class AgentCpu:
    """CPU seconds of everything this process starts (the box process trees), from a cgroup v1
    ``cpuacct`` group that this process joins: its children inherit it."""

    def __init__(self) -> None:
        self.group: Path | None = Path(f"/sys/fs/cgroup/cpuacct/vfray-bench-{os.getpid()}")
        try:
            self.group.mkdir()
            (self.group / "cgroup.procs").write_text(str(os.getpid()))
        except OSError:
            self.group = None

    def seconds(self) -> float | None:
        """The group's CPU so far, this process's own left out (None without a group)."""
        if self.group is None:
            return None
        own = psutil.Process().cpu_times()
        usage = int((self.group / "cpuacct.usage").read_text()) / 1e9
        return usage - own.user - own.system

    def close(self) -> None:
        if self.group is None:
            return
        (self.group.parent / "cgroup.procs").write_text(str(os.getpid()))
        try:
            self.group.rmdir()
        except OSError:
            # Still in it: helpers of this process that end with it (the spare network
            # namespaces' holders). A shell outside the group removes it once they are gone.
            retry = f"rmdir {self.group} 2>/dev/null && exit; sleep 0.2"
            script = f"for i in $(seq 150); do {retry}; done"
            subprocess.Popen(["/bin/sh", "-c", script], start_new_session=True)


AGENT_CPU: list[AgentCpu] = []

CLIENTS: list[tuple[str, int]] = []
"""The client address of every request the interception served (see :func:`count_clients`)."""


def count_clients() -> None:
    """A pass-through spy on the interception app that notes each HTTP request's client address
    (a list append; it changes nothing): the distinct addresses of a run are the connections
    its agents opened. A program that opens one per call costs the interception an accept, a
    protocol and a close each time."""
    serve = InterceptionApp.__call__

    async def noting(self: InterceptionApp, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope.get("client"):
            CLIENTS.append(tuple(scope["client"]))
        await serve(self, scope, receive, send)

    InterceptionApp.__call__ = noting  # type: ignore[method-assign]


BY_TASK: dict[str, float] = {}
"""With ``--by-task``: the event loop's CPU seconds per kind of callback (see :func:`by_task`)."""


def _callback_kind(handle: asyncio.Handle) -> str:
    """What a loop callback runs for: the root coroutine of the task it steps, the transport
    (and its protocol) whose event it handles, or the function's name."""
    callback = handle._callback  # type: ignore[attr-defined]
    owner = getattr(callback, "__self__", None)
    if isinstance(owner, asyncio.Task):
        return "task " + getattr(owner.get_coro(), "__qualname__", "?")
    name = getattr(callback, "__name__", "?")
    if owner is not None:
        protocol = getattr(owner, "_protocol", None)
        of = f" <{type(protocol).__name__}>" if protocol is not None else ""
        return f"{type(owner).__name__}.{name}{of}"
    return str(getattr(callback, "__qualname__", name))


@contextmanager
def by_task() -> Iterator[None]:
    """Charge each callback of asyncio's loop (a task's step, a transport's read) to what it
    runs for, in thread CPU: where a rollout's loop time goes by layer (the interception's
    request tasks, the harness's session, the box), which cProfile's per-function times of
    coroutines do not tell. The rest of the loop thread's time is the loop's own polling.
    asyncio's loop only: uvloop's handles are native."""
    run = asyncio.Handle._run

    def timed(handle: asyncio.Handle) -> None:
        start = time.thread_time()
        try:
            run(handle)
        finally:
            kind = _callback_kind(handle)
            BY_TASK[kind] = BY_TASK.get(kind, 0.0) + time.thread_time() - start

    asyncio.Handle._run = timed  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        asyncio.Handle._run = run  # type: ignore[method-assign]


@contextmanager
def peak_tree_rss() -> Iterator[list[float]]:
    """Sample this process tree's RSS every 0.25 s (in a thread); yields [peak bytes, the
    sampler thread's CPU seconds] once done (its CPU is the benchmark's, not vfray's)."""
    root, peak, stop = psutil.Process(), [0.0, 0.0], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], tree_rss(root))
            stop.wait(0.25)
        peak[1] = time.thread_time()

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield peak
    finally:
        stop.set()
        sampler.join()


def environment(harness: str, runtime: str) -> vf.LocalEnvironment:
    options = SETUPS.get(harness, (PROMPT, {}))[1]
    return vf.LocalEnvironment(
        "scripted",
        base_url=MODEL_URL[0],
        api_key="unused",
        harness=harness,
        runtime=runtime,
        harness_options=options,
    )


async def first_rollout(harness: str, runtime: str, root: str) -> tuple[float, str]:
    """Seconds from a fresh environment to its first finished rollout, tools under ``root``."""
    with tools_dir(root):
        started = time.perf_counter()
        env = environment(harness, runtime)
        async with env:
            trace = await env.rollout(tasks(1, runtime, harness)[0])
        return time.perf_counter() - started, failures([trace])


async def throughput(
    harness: str,
    runtime: str,
    root: str,
    concurrency: int,
    count: int,
    charge_by_task: bool = False,
) -> dict[str, Any]:
    gate = asyncio.Semaphore(concurrency)
    with tools_dir(root):
        env = environment(harness, runtime)

        async def one(task: WriteFile) -> vf.Trace:
            async with gate:
                return await env.rollout(task)

        async with env:
            # Warm-up: the program's files in the page cache.
            await one(tasks(1, runtime, harness)[0])
            floor = tree_rss(psutil.Process())
            CLIENTS.clear()
            BY_TASK.clear()
            box_before = AGENT_CPU[0].seconds()
            cpu_before, loop_before = psutil.Process().cpu_times(), time.thread_time()
            timed = by_task() if charge_by_task else nullcontext()
            with peak_tree_rss() as peak, timed:
                started = time.perf_counter()
                traces = await asyncio.gather(*(one(t) for t in tasks(count, runtime, harness)))
                elapsed = time.perf_counter() - started
            cpu, loop_cpu = psutil.Process().cpu_times(), time.thread_time() - loop_before
            box_after = AGENT_CPU[0].seconds()
    reaped = (
        cpu.children_user
        + cpu.children_system
        - cpu_before.children_user
        - cpu_before.children_system
    )
    agent_cpu = reaped if box_after is None or box_before is None else box_after - box_before
    agent = [t.timing["agent"].duration or 0.0 for t in traces if "agent" in t.timing]
    return {
        "rollouts_per_s": count / elapsed,
        "elapsed_s": elapsed,
        "peak_rss_mib": peak[0] / 2**20,
        "per_rollout_mib": (peak[0] - floor) / 2**20 / min(concurrency, count),
        "agent_s_mean": sum(agent) / max(1, len(agent)),
        "calls_mean": sum(len(t.calls) for t in traces) / max(1, len(traces)),
        "connections_mean": len(set(CLIENTS)) / max(1, count),
        "failed": failures(traces),
        # This process less the RSS sampler's thread (vfray: the rollouts, the interception and
        # their threads; the scripted model runs in its own process) against the box process
        # trees' (the cgroup's, or without one the reaped children's). The event loop's thread
        # alone (no worker threads) is shown too.
        "loop_cpu_ms": loop_cpu * 1000 / count,
        "vfray_cpu_ms": (cpu.user + cpu.system - cpu_before.user - cpu_before.system - peak[1])
        * 1000
        / count,
        "agent_cpu_ms": agent_cpu * 1000 / count,
        "agent_cpu_from": "reaped children" if box_after is None else "cgroup",
    }


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.1f} / {five:.1f} / {fifteen:.1f}"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--harnesses", default=",".join(HARNESSES))
    parser.add_argument("--runtime", default="subprocess", choices=["subprocess", "bwrap"])
    parser.add_argument("--concurrency", default="8,32")
    parser.add_argument("--rollouts", type=int, default=None, help="per level (default: c)")
    parser.add_argument(
        "--tools-dir",
        default=os.environ.get(TOOLS_DIR_ENV) or str(Path.home() / ".cache/vfray/tools"),
        help="the warm tool root (installed on first use if it is not)",
    )
    parser.add_argument("--no-cold", action="store_true", help="skip the cold-install rollout")
    parser.add_argument(
        "--loop",
        default="uvloop",
        choices=["asyncio", "uvloop"],
        help="the event loop: uvloop, as vfray runs rollouts on both backends (a Ray "
        "SandboxHost actor's loop; the local backend's, farm.event_loop), or asyncio's",
    )
    parser.add_argument(
        "--by-task",
        action="store_true",
        help="print the event loop's CPU per rollout by task and transport (--loop asyncio)",
    )
    parser.add_argument(
        "--gc",
        default="vfray",
        choices=["vfray", "python"],
        help="the garbage collector's thresholds: vfray's, as the vfray command and its Ray "
        "actors set them (vfray.owned_process), or Python's defaults",
    )
    args = parser.parse_args()
    if args.gc == "vfray":
        tune_owned_process()
    if args.by_task and args.loop != "asyncio":
        parser.error("--by-task needs --loop asyncio (uvloop's callbacks are native)")
    count_clients()
    harnesses = args.harnesses.split(",")
    levels = [int(c) for c in args.concurrency.split(",")]
    print(
        f"{os.cpu_count()} CPUs, load average {load()} (1/5/15 min); runtime {args.runtime}; "
        f"scripted 'agent' model at 0 s latency (its own process); {args.loop} loop; "
        f"gc thresholds {gc.get_threshold()}; warm tool dir {args.tools_dir}\n"
    )
    summary: list[tuple[str, int, dict[str, Any]]] = []
    for harness in harnesses:
        # The warm figure comes after a rollout that makes sure the tool dir is installed.
        await first_rollout(harness, args.runtime, args.tools_dir)
        warm, warm_failed = await first_rollout(harness, args.runtime, args.tools_dir)
        line = f"{harness}: first rollout, tool dir warm {warm:.1f} s"
        if not args.no_cold:
            fresh = Path(tempfile.mkdtemp(prefix="vfray-cold-tools-", dir="/tmp"))
            try:
                cold, cold_failed = await first_rollout(harness, args.runtime, str(fresh))
            finally:
                remove_tree(fresh)
            line += f", cold {cold:.1f} s (x{cold / warm:.1f}) {cold_failed}"
        print(line + (f" {warm_failed}" if warm_failed else ""))
        rates = {}
        for level in levels:
            count = args.rollouts or level
            row = await throughput(
                harness, args.runtime, args.tools_dir, level, count, args.by_task
            )
            rates[level] = row["rollouts_per_s"]
            print(
                f"  c={level:<3} {count} rollouts: {row['rollouts_per_s']:.2f} rollouts/s "
                f"({row['elapsed_s']:.1f} s), peak tree RSS {row['peak_rss_mib']:.0f} MiB "
                f"({row['per_rollout_mib']:.0f} MiB per rollout in flight above the idle "
                f"environment), "
                f"agent phase mean {row['agent_s_mean']:.1f} s, "
                f"{row['calls_mean']:.1f} model calls each over "
                f"{row['connections_mean']:.1f} connections {row['failed']}"
            )
            share = row["vfray_cpu_ms"] / max(row["agent_cpu_ms"], 1e-9)
            print(
                f"  c={level:<3} CPU per rollout: vfray {row['vfray_cpu_ms']:.0f} ms (its event "
                f"loop {row['loop_cpu_ms']:.0f} ms), the agent {row['agent_cpu_ms']:.0f} ms "
                f"({row['agent_cpu_from']}): vfray CPU / agent CPU {share:.1%} (goal <= 5%)"
            )
            summary.append((harness, level, row))
            if args.by_task:
                spent = sum(BY_TASK.values())
                print(
                    f"  c={level:<3} the loop's callbacks: {1000 * spent / count:.2f} ms a rollout"
                )
                for kind, seconds in sorted(BY_TASK.items(), key=lambda kv: -kv[1])[:20]:
                    print(f"    {1000 * seconds / count:7.3f} ms  {kind}")
        if len(levels) > 1:
            low, high = min(levels), max(levels)
            print(f"  c={high} / c={low} rollouts/s: x{rates[high] / rates[low]:.2f}")
        print(f"  load average now {load()}")
    print(f"\n{'harness':<16} {'c':>3} {'vfray ms':>9} {'agent ms':>9}  vfray CPU / agent CPU")
    for harness, level, row in summary:
        share = row["vfray_cpu_ms"] / max(row["agent_cpu_ms"], 1e-9)
        print(
            f"{harness:<16} {level:>3} {row['vfray_cpu_ms']:>9.1f} {row['agent_cpu_ms']:>9.0f}  "
            f"{share:.1%}{'' if share <= 0.05 else ' (over 5%)'}"
        )


if __name__ == "__main__":
    logging.getLogger("vfray.runtimes.subprocess").setLevel(logging.ERROR)
    logging.getLogger("vfray.runtimes.registry").setLevel(logging.ERROR)
    # The model's process first, outside the group that this process then joins.
    with scripted_model():
        AGENT_CPU.append(AgentCpu())
        try:
            # --loop asyncio (main parses it: a wrong value exits there)
            if any(arg.endswith("asyncio") for arg in sys.argv[1:]):
                asyncio.run(main())
            else:
                import uvloop

                uvloop.run(main())
        finally:
            AGENT_CPU[0].close()
