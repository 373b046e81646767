"""vfray's CPU per model call through the interception, one agent at a time (issue 30's goal).

Three processes: the scripted model, the interception (a real :class:`InterceptionApp` under
uvicorn, one session per rollout), and this client, which plays rollouts of ``--calls`` calls one
after another, each call the conversation so far plus the model's last reply, as an agent does.
Shapes: ``responses`` (Codex: ~12 KB of instructions, five function tools, a streamed Responses
call), ``chat`` (terminus-2, bash: a chat call with one tool, not streamed) and ``chat-stream``.
Prints the interception process's CPU (user + system, from ``/proc``) per call and per rollout.

    python benchmarks/interception_cpu.py                          # ~20 s
    python benchmarks/interception_cpu.py --trees /tmp/before,.    # alternate two source trees
    python benchmarks/interception_cpu.py --profile /tmp/icpt.prof # cProfile the interception
    python benchmarks/interception_cpu.py --profile /tmp/icpt.txt  # py-spy's collapsed stacks
    python benchmarks/interception_cpu.py --stream-events 200,2000 # per event of a long stream

``--trees`` serves the interception from each tree in turn (its ``PYTHONPATH``), ``--runs``
times, alternated, so a shared machine's load falls on both alike; the model and the client
run from this tree. ``--bare`` adds a baseline to every run: a bare relay (aiohttp forwards the
body as it came and streams the reply back, recording nothing) served the same way, and prints
each tree's ratio to it. The served processes set vfray's garbage-collector thresholds, as
every process that runs its interception does (:mod:`vfray.owned_process`; ``--gc python``
keeps Python's).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
SHAPES = ("responses", "chat", "chat-stream")
INSTRUCTIONS = " ".join(f"Rule {i}: keep the change small and run the tests." for i in range(240))
PARAMETERS = {
    "type": "object",
    "properties": {
        "command": {"type": "array", "items": {"type": "string"}, "description": "argv"},
        "workdir": {"type": "string", "description": "the working directory"},
        "timeout_ms": {"type": "number", "description": "the timeout in milliseconds"},
    },
    "required": ["command"],
    "additionalProperties": False,
}
OUTPUT = "output line\n" * 40
NEXT = "the command ran, exit code 0. What next?"
TOOL_NAMES = ("shell", "apply_patch", "update_plan", "view_image", "read_file")


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- the served processes ------------------------------------------------------------------------


async def _serve(kind: str, upstream: str, sessions: int, profile: str) -> None:
    from vfray.endpoints.serving import serve_in_loop
    from vfray.interception import InterceptionApp, Upstream
    from vfray.models.scripted.server import ScriptedModel
    from vfray.trace import TaskRecord, Trace

    app: Any
    secrets: list[str] = []
    if kind == "model":
        app = ScriptedModel("echo", history_size=1)
    elif kind == BARE:
        app = _BareRelay(upstream)
        secrets = ["-"] * sessions
    else:
        app = InterceptionApp(Upstream(upstream, model="bench", sampling={"temperature": 0.0}))
        secrets = [
            app.register(Trace(task=TaskRecord(key=str(i), hash="h"))) for i in range(sessions)
        ]
    profiler = None
    if profile:
        import cProfile

        profiler = cProfile.Profile(time.thread_time)  # the event loop thread's CPU
    async with serve_in_loop(app, timeout_keep_alive=600) as url:
        print(json.dumps({"url": url, "secrets": secrets}), flush=True)
        if profiler is not None:
            profiler.enable()
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(profile)
        calls = app.calls if kind == BARE else sum(len(app.conclude(s).calls) for s in secrets)
        print(json.dumps({"calls": calls}), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    if kind != "model":
        await app.aclose()


BARE = "bare"
"""``--bare``'s row: the relay below, not a tree."""


class _BareRelay:
    """The floor of a Python relay of these calls: the body forwarded as it came, the reply's
    status, content type and bytes streamed back as they arrive; nothing parsed or recorded."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.http: aiohttp.ClientSession | None = None
        self.calls = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if self.http is None:
            self.http = aiohttp.ClientSession()
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        route = self.upstream + scope["path"].removeprefix("/v1")
        headers = {"content-type": "application/json"}
        async with self.http.post(route, data=body, headers=headers) as reply:
            kind = reply.headers.get("content-type", "application/json").encode()
            start = {"status": reply.status, "headers": [(b"content-type", kind)]}
            await send({"type": "http.response.start", **start})
            async for chunk in reply.content.iter_any():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        self.calls += 1

    async def aclose(self) -> None:
        if self.http is not None:
            await self.http.close()


class Served:
    def __init__(
        self,
        kind: str,
        tree: Path = ROOT,
        upstream: str = "",
        sessions: int = 0,
        profile: str = "",
        gc: str = "vfray",
    ) -> None:
        argv = [sys.executable, __file__, "--serve", kind, "--upstream", upstream, "--gc", gc]
        self.proc = subprocess.Popen(
            [*argv, "--sessions", str(sessions), "--profile", profile],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=tree,
            env={**os.environ, "PYTHONPATH": str(tree)},
        )
        info = self._line()
        self.url: str = info["url"]
        self.secrets: list[str] = info["secrets"]

    def _line(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"served process exited: {self.proc.wait()}")
        data: dict[str, Any] = json.loads(line)
        return data

    def calls(self) -> int:
        """Stop profiling and conclude every session; the calls recorded on their traces."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        return int(self._line()["calls"])

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# -- the agent -----------------------------------------------------------------------------------


def _item(role: str, text: str) -> dict[str, Any]:
    return {"type": "message", "role": role, "content": [{"type": "input_text", "text": text}]}


def _first(shape: str, rollout: int) -> dict[str, Any]:
    # The model (echo) repeats the last user message: a short one, so that a streamed reply has
    # Codex's ~17 events; the bulk of a turn (context, a command's output) comes before it.
    context = "Context. " * 150
    task = f"rollout {rollout}: write hello into out.txt and check it."
    if shape == "responses":
        tools = [
            {"type": "function", "name": n, "description": f"the {n} tool " * 20,
             "strict": False, "parameters": PARAMETERS}
            for n in TOOL_NAMES
        ]  # fmt: skip
        return {
            "model": "gpt-5-codex",
            "instructions": INSTRUCTIONS,
            "input": [
                _item("developer", "<permissions> sandboxed </permissions>"),
                _item("user", context),
                _item("user", task),
            ],
            "tools": tools, "tool_choice": "auto", "parallel_tool_calls": False,
            "reasoning": None, "store": False, "stream": True, "include": [],
            "prompt_cache_key": f"conversation-{rollout}",
        }  # fmt: skip
    tool = {
        "type": "function",
        "function": {"name": "bash", "description": "run a command", "parameters": PARAMETERS},
    }
    return {
        "model": "m",
        "messages": [
            {"role": "system", "content": INSTRUCTIONS[:3000]},
            {"role": "user", "content": context},
            {"role": "user", "content": task},
        ],
        "tools": [tool],
        "stream": shape == "chat-stream",
        **({"stream_options": {"include_usage": True}} if shape == "chat-stream" else {}),
    }


def _events(raw: bytes) -> list[dict[str, Any]]:
    events = []
    for block in raw.decode().split("\n\n"):
        for line in block.splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
    return events


def _continue(shape: str, body: dict[str, Any], raw: bytes, call: int) -> None:
    """Append the model's reply and the next user turn, as the agent sends them back."""
    if shape == "responses":
        done = [e["item"] for e in _events(raw) if e["type"] == "response.output_item.done"]
        body["input"] += done
        body["input"] += [_item("user", OUTPUT), _item("user", f"call {call}: {NEXT}")]
        return
    if shape == "chat":
        message = json.loads(raw)["choices"][0]["message"]
    else:
        content = "".join(
            e["choices"][0]["delta"].get("content") or "" for e in _events(raw) if e.get("choices")
        )
        message = {"role": "assistant", "content": content}
    body["messages"] += [
        message,
        {"role": "user", "content": OUTPUT},
        {"role": "user", "content": f"call {call}: {NEXT}"},
    ]


async def _rollouts(url: str, secrets: list[str], shape: str, calls: int) -> None:
    route = "/v1/responses" if shape == "responses" else "/v1/chat/completions"
    async with aiohttp.ClientSession() as http:
        for rollout, secret in enumerate(secrets):
            headers = {"authorization": f"Bearer {secret}", "content-type": "application/json"}
            body = _first(shape, rollout)
            for call in range(calls):
                async with http.post(url + route, data=json.dumps(body), headers=headers) as r:
                    raw = await r.read()
                    assert r.status == 200, raw[:300]
                _continue(shape, body, raw, call)


def _measure(
    tree: Path | str,
    model: Served,
    shape: str,
    rollouts: int,
    calls: int,
    profile: str = "",
    gc: str = "vfray",
) -> float:
    """The interception process's CPU seconds per call, for ``rollouts`` x ``calls`` calls
    (``tree`` :data:`BARE`: the bare relay's, served from this tree)."""
    spy = profile.endswith(".txt")
    kind, root = ("vfray", tree) if isinstance(tree, Path) else (BARE, ROOT)
    proxy = Served(kind, root, f"{model.url}/v1", rollouts + 1, "" if spy else profile, gc)
    try:
        # One rollout's warm-up, uncounted: imports, the upstream connection, first-use caches.
        asyncio.run(_rollouts(proxy.url, proxy.secrets[:1], shape, calls))
        if spy:  # py-spy's collapsed stacks, CPU samples only: far less overhead than cProfile
            argv = ["py-spy", "record", "-f", "raw", "-r", "1000", "-o", profile]
            sampler = subprocess.Popen([*argv, "--pid", str(proxy.proc.pid)])
            time.sleep(1.0)
        cpu = _cpu_seconds(proxy.proc.pid)
        asyncio.run(_rollouts(proxy.url, proxy.secrets[1:], shape, calls))
        cpu = _cpu_seconds(proxy.proc.pid) - cpu
        if spy:
            sampler.send_signal(signal.SIGINT)
            sampler.wait()
        recorded = proxy.calls()
        assert recorded == (rollouts + 1) * calls, recorded
    finally:
        proxy.close()
    return cpu / (rollouts * calls)


def _stream_events(counts: list[int]) -> None:
    """vfray's own work per event of a streamed chat reply with token ids (an RL call on vLLM:
    one event per token), in this process: split, parse, accumulate, as the relay does."""
    from vfray.interception.dialects import DIALECTS
    from vfray.interception.dialects.base import SSESplitter, parse_sse_block

    def event(i: int) -> bytes:
        lp = {"content": [{"token": f" w{i}", "logprob": -0.1, "bytes": [32], "top_logprobs": []}]}
        choice = {"index": 0, "delta": {"content": f" w{i}"}, "logprobs": lp, "token_ids": [i]}
        chunk = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [choice]}
        return f"data: {json.dumps(chunk)}\n\n".encode()

    for n in counts:
        raw = b"".join(event(i) for i in range(n)) + b"data: [DONE]\n\n"
        chunks = [raw[i : i + 4096] for i in range(0, len(raw), 4096)]
        best = float("inf")
        for _ in range(3):
            began = time.process_time()
            accumulator, splitter = DIALECTS["chat"].accumulator(True), SSESplitter()
            for chunk in chunks:
                for block in splitter.feed(chunk):
                    accumulator.feed(parse_sse_block(block))
            assert len(accumulator.result().completion_token_ids or []) == n
            best = min(best, time.process_time() - began)
        print(f"{n:>6} events: {best * 1e3:8.2f} ms per call, {best / n * 1e6:6.1f} us per event")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--rollouts", type=int, default=40)
    parser.add_argument("--calls", type=int, default=4, help="model calls per rollout")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--trees", default=str(ROOT), help="comma-separated source trees")
    parser.add_argument("--profile", default="", help="write the interception's cProfile here")
    parser.add_argument(
        "--bare", action="store_true", help="also a bare relay, as the baseline of each run"
    )
    parser.add_argument(
        "--gc",
        default="vfray",
        choices=["vfray", "python"],
        help="the served processes' collector thresholds: vfray's (vfray.owned_process), as "
        "the processes that run its interception set them, or Python's defaults",
    )
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--upstream", default="", help=argparse.SUPPRESS)
    parser.add_argument("--sessions", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument(
        "--stream-events",
        default="",
        help="only: vfray's CPU per event of streamed chat replies of these lengths (200,2000)",
    )
    args = parser.parse_args()
    if args.stream_events:
        _stream_events([int(n) for n in args.stream_events.split(",")])
        return
    if args.serve:
        if args.gc == "vfray":
            from vfray.owned_process import tune_owned_process

            tune_owned_process()
        asyncio.run(_serve(args.serve, args.upstream, args.sessions, args.profile))
        return
    trees: list[Path | str] = [Path(t).resolve() for t in args.trees.split(",")]
    if args.bare:
        trees.append(BARE)
    shapes = args.shapes.split(",")
    model = Served("model", gc=args.gc)
    try:
        if args.profile:
            _measure(trees[0], model, shapes[0], args.rollouts, args.calls, args.profile, args.gc)
            print(f"profile of {shapes[0]} written to {args.profile}")
            return
        results: dict[tuple[str, Path | str], list[float]] = {}
        for run in range(args.runs):
            for shape in shapes:
                for tree in trees if run % 2 == 0 else trees[::-1]:
                    ms = _measure(tree, model, shape, args.rollouts, args.calls, gc=args.gc)
                    results.setdefault((shape, tree), []).append(ms * 1e3)
            print(f"run {run + 1}/{args.runs} done, load {os.getloadavg()[0]:.1f}", flush=True)
    finally:
        model.close()
    print(
        f"\ninterception CPU, {args.rollouts} rollouts x {args.calls} calls per row and run, "
        f"scripted model at zero latency; median (min-max) of {args.runs} runs"
    )
    print(f"{'shape':<13}{'tree':<28}{'ms / call':>22}{'ms / rollout':>14}")
    for (shape, tree), values in results.items():
        mid = statistics.median(values)
        spread = f"{mid:.3f} ({min(values):.3f}-{max(values):.3f})"
        ratio = ""
        if args.bare and tree != BARE:
            # Paired: each run's tree against the bare relay of the same run.
            pairs = zip(values, results[shape, BARE], strict=True)
            ratio = f"{statistics.median(v / b for v, b in pairs):>8.2f}x bare"
        row = f"{shape:<13}{str(tree)[-27:]:<28}{spread:>22}{mid * args.calls:>14.2f}{ratio}"
        print(row)


if __name__ == "__main__":
    main()
