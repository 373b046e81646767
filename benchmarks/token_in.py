"""What token-in/token-out costs per turn: 64 sessions of multi-turn chats through the
interception, with ``interception.token_in`` off (today's path: the endpoint renders the whole
history) and on (a local chat template renders each turn's bridge; the endpoint takes tokens).

The upstream is the scripted model serving a byte-level BPE tokenizer and a ChatML template (as
``tests/test_token_in.py`` builds them), in its own process, so the interception's process time
is measured alone: CPU seconds of this process (the interception and the clients) per turn, and
wall time per turn; the upstream's own CPU per turn is read from its process (with token-in it
renders and tokenizes no history). Both runs use the same server, tokenizer and conversations.
Each run starts from a full collection with the process's older objects frozen, so a full
collection of the startup heap landing in one mode's run does not decide the comparison. The
collector runs with the thresholds vfray sets in the processes that run its interception (the
``vfray`` command, its Ray actors: :mod:`vfray.owned_process`); ``--gc python`` keeps Python's.
The issue's goal compares token-in with "today's interception", and the process holds the 64
clients too: each repeat also sends the same sessions straight to the upstream ("clients
alone", asking for the token ids as the interception does, so the replies they read are the
same size), and the interception's own CPU per turn is printed as well, the process's less the
clients' (and so with ``--instructions``).
``--tools`` sends a tool list (about 12 KB of schemas, as agents do) with every call. Each
mode's ratio to messages is given of the medians and paired (the median of each repeat's own
ratio: every repeat runs the modes back to back). ``--only MODE`` (repeatable) and
``--follow-ups same|distinct`` run part of the table. ``--tokenizer FOLDER`` measures with a
model's own tokenizer and chat template (a folder with ``tokenizer.json`` and
``tokenizer_config.json``, as a Hugging Face model ships them) instead of the test's.
``--drop-reasoning``: the clients send each reply back without its ``reasoning_content``, as
most agents do (the reply still continues its branch: the model's context holds it).
``--latency SECONDS``: the upstream answers each call after that long, as a serving engine does
(the default 0 makes the two modes' replies arrive at different rates: token-in's upstream
renders no history, so it answers faster).

``--instructions`` counts instructions instead of timing CPU: each mode runs in a process of
its own under valgrind's cachegrind (``apt install valgrind``), once with one block of the
sessions and once with ``1 + --blocks`` blocks on the same interception, and a turn's count is
the difference over the extra blocks' turns. The first block (imports, the interception's
start, a template's first renders and checks) cancels out, and a count hardly moves with the
machine's load: runs agree to about two points (the event loop's wake-ups follow the native
upstream's timing), where CPU time on a busy 2-core machine spreads by ten. It counts
user-space instructions only (not the kernel's socket work, the same in every mode) and takes a
few minutes (cachegrind runs the process ~50x slower). ``--processes N`` times CPU the same
way, in a fresh process per mode and run: N rounds, each mode and the clients alone in turn (the
order flips every round), the CPU of the blocks after the first. ``--apart`` (with either):
the clients run in a process of their own, driven block by block over a pipe, so the measured
process holds the interception alone and nothing is subtracted.

    python benchmarks/token_in.py [--sessions 64] [--turns 8] [--repeats 3] [--tools]
        [--only 'token-in, local'] [--follow-ups distinct] [--tokenizer FOLDER]
        [--drop-reasoning] [--latency 0.01] [--instructions [--blocks 2]]
        [--processes 6 [--blocks 3]] [--apart] [--gc vfray|python]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from vfray.interception import Interception, Upstream
from vfray.interception.dialects import DIALECTS
from vfray.interception.settings import InterceptionSettings
from vfray.interception.token_in import TokenIn
from vfray.owned_process import tune_owned_process
from vfray.trace import TaskRecord, Trace
from vfray.traces.samples import to_samples

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_token_in import CORPUS, SPECIALS, TEMPLATE

Modes = dict[str, tuple[InterceptionSettings, dict[str, bool]]]
"""Each mode's interception settings and TokenIn options, by name."""
CHAT = DIALECTS["chat"]
CLIENTS = "clients alone"
"""Not a mode: the same sessions straight to the upstream, for the clients' own share of the
process (the interception's own cost per turn is a mode's less it)."""


def build_model(folder: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {"chat_template": TEMPLATE, "eos_token": "<|im_end|>"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


def serve(folder: str, port: Any, latency: float = 0.0) -> None:
    """The scripted model with the template, in its own process, answering each call after
    ``latency`` seconds."""
    import uvicorn

    from vfray.endpoints.chat_template import ChatTemplate
    from vfray.models.scripted.server import ScriptedModel

    template = ChatTemplate.load(folder)
    app = ScriptedModel("echo", chat_template=template, think="let me see", latency=latency)
    # A long keep-alive, as a serving engine behind a proxy has: uvicorn's 5 s default let the
    # server close a pooled connection just as the interception reused it (a 503, under load).
    config = uvicorn.Config(
        app, host="127.0.0.1", port=0, log_level="error", timeout_keep_alive=600
    )
    server = uvicorn.Server(config)

    async def run() -> None:
        task = asyncio.create_task(server.serve())
        while not server.started:
            await asyncio.sleep(0.01)
        port.value = server.servers[0].sockets[0].getsockname()[1]
        await task

    asyncio.run(run())


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": f"tool_{i}",
            "description": f"Tool number {i}: runs a command and returns what it printed. " * 4,
            "parameters": {
                "type": "object",
                "properties": {
                    "command": {"type": "string", "description": "the command line to run"},
                    "timeout": {"type": "integer", "description": "seconds before it is killed"},
                    "workdir": {"type": "string", "description": "where it runs"},
                },
                "required": ["command"],
            },
        },
    }
    for i in range(20)
]


def upstream_cpu(pid: int) -> float:
    """CPU seconds of the upstream's process so far (user + system, from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def modes_for(folder: Path) -> Modes:
    """Each mode's interception settings and TokenIn options, messages (today's path) first."""
    local = InterceptionSettings(token_in=True, tokenizer=str(folder))
    return {
        "messages (today)": (InterceptionSettings(), {}),
        "token-in, local, no cache": (local, {"cache": False}),
        "token-in, local, rendered": (local, {"joined": False}),
        "token-in, local": (local, {}),
        "token-in, /tokenize": (InterceptionSettings(token_in=True), {}),
    }


async def session(
    http: aiohttp.ClientSession,
    url: str,
    secret: str,
    turns: int,
    tag: str,
    tools: bool,
    drop_reasoning: bool = False,
    direct: bool = False,
) -> None:
    """One client's chat of ``turns`` calls. ``direct``: to the upstream itself, as the
    interception would forward it (asking for the token ids), so that the reply the client
    reads is the same size."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "echo hello world"}]
    headers = {"authorization": f"Bearer {secret}"}
    for turn in range(turns):
        body: dict[str, Any] = {"model": "m", "messages": messages}
        if tools:
            body["tools"] = TOOLS
        if direct:  # straight to the upstream: the body the interception would forward
            body = CHAT.impose(body, "m", {"return_tokens": True})
        async with http.post(f"{url}/chat/completions", json=body, headers=headers) as response:
            reply = await response.json()
            assert response.status == 200, reply
        message = reply["choices"][0]["message"]
        if drop_reasoning:  # as most agents send a reply back: its content and calls alone
            message.pop("reasoning_content", None)
        messages.append(message)
        messages.append({"role": "user", "content": f"and again, once more {turn}{tag}"})


def set_options(token_in: TokenIn, *, cache: bool = True, joined: bool = True) -> None:
    """A mode's TokenIn options: ``cache=False`` keeps no bridge, ``joined=False`` renders
    every new bridge by the template (none joined from the text around its content)."""
    token_in.cache_bridges = cache
    if not joined:
        token_in.wrappers = None


async def measure(
    url: str,
    settings: InterceptionSettings,
    sessions: int,
    turns: int,
    *,
    distinct: bool = False,
    cache: bool = True,
    joined: bool = True,
    tools: bool = False,
    drop_reasoning: bool = False,
    server_pid: int | None = None,
) -> dict[str, float]:
    """``distinct``: every session sends follow-ups of its own (no bridge is rendered twice);
    otherwise they send the same ones, as a group's rollouts send a task's next user turn.
    ``joined=False``: every new bridge is rendered by the template, none joined from the text
    around its content (:mod:`vfray.interception._bridge_wrappers`)."""
    upstream = Upstream(url, model="m", sampling={"return_tokens": True})
    spent = [0.0]
    async with Interception(upstream, settings=settings) as icpt:
        token_in = icpt.app.token_in
        if token_in is not None:
            set_options(token_in, cache=cache, joined=joined)
            prompt = token_in.prompt

            async def timed(*args: Any) -> Any:
                # A local bridge never suspends, so this thread's CPU over the call is its own
                # (a /tokenize bridge awaits the endpoint: other tasks' CPU lands in it too).
                start = time.thread_time()
                try:
                    return await prompt(*args)
                finally:
                    spent[0] += time.thread_time() - start

            token_in.prompt = timed  # type: ignore[method-assign]
        traces = [Trace(task=TaskRecord(key=str(i), hash="h")) for i in range(sessions)]
        secrets = [icpt.app.register(t) for t in traces]
        connector = aiohttp.TCPConnector(limit=sessions)
        async with aiohttp.ClientSession(connector=connector) as http:
            gc.collect()
            gc.freeze()
            up = upstream_cpu(server_pid) if server_pid else 0.0
            cpu, wall = time.process_time(), time.perf_counter()
            tags = [f" (session {i})" if distinct else "" for i in range(sessions)]
            runs = zip(secrets, tags, strict=True)
            await asyncio.gather(
                *(session(http, icpt.url, s, turns, tag, tools, drop_reasoning) for s, tag in runs)
            )
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            up = (upstream_cpu(server_pid) if server_pid else 0.0) - up
            gc.unfreeze()
    samples = to_samples(traces).to_pylist()
    lost = sum(1 for row in samples if row["token_error"] is not None)
    n = sessions * turns
    return {
        "cpu_ms": 1000 * cpu / n,
        "wall_ms": 1000 * wall / n,
        "upstream_ms": 1000 * up / n,
        "prompt_ms": 1000 * spent[0] / n,
        "lost": lost,
        "samples": len(samples),
    }


async def run_blocks(
    url: str,
    settings: InterceptionSettings,
    options: dict[str, bool],
    sessions: int,
    turns: int,
    blocks: int,
    *,
    distinct: bool,
    tools: bool,
    drop_reasoning: bool,
    apart: bool = False,
) -> float:
    """``blocks`` rounds of the sessions on one interception, each with traces of its own and
    follow-ups of its own (a bridge cached in one block is not found in the next); the
    process's CPU ms per turn over the blocks after the first (0 with one block). ``apart``:
    the clients run in a process of their own (:func:`serve_clients`), so this process's CPU
    is the interception's alone."""
    upstream = Upstream(url, model="m", sampling={"return_tokens": True})
    cpu = 0.0
    async with Interception(upstream, settings=settings) as icpt:
        if icpt.app.token_in is not None:
            set_options(icpt.app.token_in, **options)
        async with contextlib.AsyncExitStack() as stack:
            if apart:
                shape = [icpt.url, turns, tools, drop_reasoning]
                clients = await asyncio.create_subprocess_exec(
                    sys.executable, __file__, "--clients", json.dumps(shape),
                    stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                )  # fmt: skip
                stack.push_async_callback(clients.wait)
            else:
                connector = aiohttp.TCPConnector(limit=sessions)
                http = await stack.enter_async_context(aiohttp.ClientSession(connector=connector))
            for block in range(blocks):
                if block == 1:  # the first block started the interception and its caches
                    cpu = time.process_time()
                traces = [Trace(task=TaskRecord(key=str(i), hash="h")) for i in range(sessions)]
                secrets = [icpt.app.register(t) for t in traces]
                tags = [
                    f" (block {block}, session {i})" if distinct else f" (block {block})"
                    for i in range(sessions)
                ]
                if apart:
                    assert clients.stdin is not None and clients.stdout is not None
                    clients.stdin.write(json.dumps([secrets, tags]).encode() + b"\n")
                    await clients.stdin.drain()
                    if not await clients.stdout.readline():
                        raise SystemExit("the clients' process ended before its block was done")
                    continue
                runs = zip(secrets, tags, strict=True)
                calls = (
                    session(http, icpt.url, s, turns, tag, tools, drop_reasoning) for s, tag in runs
                )
                await asyncio.gather(*calls)
            if blocks > 1:
                cpu = time.process_time() - cpu
            if apart:
                assert clients.stdin is not None
                clients.stdin.close()
    return 1000 * cpu / max(1, (blocks - 1) * sessions * turns)


async def serve_clients(url: str, turns: int, tools: bool, drop_reasoning: bool) -> None:
    """``--apart``'s clients: for each line on stdin (a block's secrets and follow-up tags),
    that block's sessions against the interception at ``url``, then a line on stdout."""
    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            secrets, tags = json.loads(line)
            runs = zip(secrets, tags, strict=True)
            await asyncio.gather(
                *(session(http, url, s, turns, tag, tools, drop_reasoning) for s, tag in runs)
            )
            print("done", flush=True)


async def clients_alone(
    url: str,
    sessions: int,
    turns: int,
    blocks: int = 1,
    *,
    distinct: bool,
    tools: bool,
    drop_reasoning: bool,
) -> float:
    """The same sessions straight to the upstream, no interception (``blocks`` rounds, each
    with follow-ups of its own); the process's CPU ms per turn over them: the clients' own
    share of a mode's figure."""
    connector = aiohttp.TCPConnector(limit=sessions)
    async with aiohttp.ClientSession(connector=connector) as http:
        gc.collect()
        gc.freeze()
        cpu = time.process_time()
        for block in range(blocks):
            if block == 1:  # as run_blocks: the blocks after the first when there are more
                cpu = time.process_time()
            tags = [
                f" (block {block}, session {i})" if distinct else f" (block {block})"
                for i in range(sessions)
            ]
            await asyncio.gather(
                *(session(http, url, "-", turns, tag, tools, drop_reasoning, True) for tag in tags)
            )
        cpu = time.process_time() - cpu
        gc.unfreeze()
    return 1000 * cpu / ((blocks - 1 if blocks > 1 else 1) * sessions * turns)


def child_command(
    url: str, folder: Path, mode: str, blocks: int, distinct: bool, args: argparse.Namespace
) -> list[str]:
    """The command of a process that runs ``blocks`` blocks of ``mode`` (or the clients alone)
    and prints its CPU per turn over the blocks after the first."""
    return [
        sys.executable,
        __file__,
        "--child",
        json.dumps([url, mode, blocks, distinct]),
        f"--sessions={args.sessions}",
        f"--turns={args.turns}",
        f"--tokenizer={folder}",
        f"--gc={args.gc}",
        *(["--tools"] if args.tools else []),
        *(["--drop-reasoning"] if args.drop_reasoning else []),
        *(["--apart"] if args.apart else []),
    ]


def process_cpu(
    url: str, folder: Path, mode: str, distinct: bool, args: argparse.Namespace
) -> float:
    """CPU ms per turn of a fresh process running ``1 + --blocks`` blocks of ``mode``, over
    the blocks after the first."""
    command = child_command(url, folder, mode, 1 + args.blocks, distinct, args)
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the {mode!r} run failed: {done.stderr.strip()[-2000:]}")
    return float(json.loads(done.stdout.strip().splitlines()[-1])["cpu_ms"])


def compare_processes(
    url: str, folder: Path, modes: Modes, kinds: tuple[bool, ...], args: argparse.Namespace
) -> None:
    """``--processes N``: N rounds, each running every mode and the clients alone in a fresh
    process of its own, in an order that flips every round; medians and paired ratios."""
    print(
        f"{args.sessions} sessions x {args.turns} turns, {args.processes} rounds of a fresh "
        f"process per mode ({1 + args.blocks} blocks each, CPU of the last {args.blocks})"
    )
    for distinct in kinds:
        kind = "distinct follow-ups per session" if distinct else "the same follow-ups"
        print(f" {kind}:", flush=True)
        runs: dict[str, list[float]] = {}
        for round_ in range(args.processes):
            order = [*modes] if args.apart else [*modes, CLIENTS]
            if round_ % 2:
                order.reverse()
            for mode in order:
                runs.setdefault(mode, []).append(process_cpu(url, folder, mode, distinct, args))
        if args.apart:
            print_apart(runs)
            continue
        clients = runs.pop(CLIENTS)
        base = runs["messages (today)"]
        own_base = [b - c for b, c in zip(base, clients, strict=True)]
        for mode, cpu in runs.items():
            own = [r - c for r, c in zip(cpu, clients, strict=True)]
            whole = statistics.median(cpu) / statistics.median(base) - 1
            paired = statistics.median(r / b - 1 for r, b in zip(cpu, base, strict=True))
            alone = statistics.median(own) / statistics.median(own_base) - 1
            alone_paired = statistics.median(o / b - 1 for o, b in zip(own, own_base, strict=True))
            print(
                f"  {mode:26s} cpu {statistics.median(cpu):6.3f} ms/turn ({whole:+.1%}; paired "
                f"{paired:+.1%})   the interception alone {statistics.median(own):6.3f} "
                f"({alone:+.1%}; paired {alone_paired:+.1%})"
            )
        print(f"  ({CLIENTS}: {statistics.median(clients):.3f} ms/turn)")


def print_apart(runs: dict[str, list[float]], unit: str = "ms/turn", scale: float = 1.0) -> None:
    """``--apart``'s figures: each mode's interception process alone, against messages."""
    base = runs["messages (today)"]
    for mode, values in runs.items():
        whole = statistics.median(values) / statistics.median(base) - 1
        paired = statistics.median(r / b - 1 for r, b in zip(values, base, strict=True))
        spread = f"{min(values) * scale:.3f}-{max(values) * scale:.3f}"
        print(
            f"  {mode:26s} the interception alone {statistics.median(values) * scale:8.3f} "
            f"{unit} ({whole:+.1%}; paired {paired:+.1%}; runs {spread})"
        )


def instructions(
    url: str, folder: Path, mode: str, blocks: int, distinct: bool, args: argparse.Namespace
) -> int:
    """Instructions of a process that runs ``blocks`` blocks of ``mode``, under cachegrind."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "cachegrind.out"
        command = [
            "valgrind",
            "--tool=cachegrind",
            "--cache-sim=no",
            f"--cachegrind-out-file={out}",
            *child_command(url, folder, mode, blocks, distinct, args),
        ]
        # A fixed hash seed: set and dict orders, and so the work done, are the same each run.
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"the {mode!r} run failed: {done.stderr.strip()[-2000:]}")
        for line in out.read_text().splitlines():
            if line.startswith("summary:"):
                return int(line.split()[1])
        raise SystemExit(f"cachegrind wrote no summary for the {mode!r} run")


def count_instructions(
    url: str, folder: Path, modes: Modes, kinds: tuple[bool, ...], args: argparse.Namespace
) -> None:
    turns = args.blocks * args.sessions * args.turns
    tools = f", {len(json.dumps(TOOLS)) // 1000} KB of tools per call" if args.tools else ""
    print(
        f"{args.sessions} sessions x {args.turns} turns{tools}: instructions of the "
        f"interception's process per turn (runs of 1 and {1 + args.blocks} blocks, the "
        "difference over the extra blocks' turns; cachegrind, user space)"
    )
    for distinct in kinds:
        kind = "distinct follow-ups per session" if distinct else "the same follow-ups"
        print(f" {kind}:", flush=True)
        counted: dict[str, float] = {}
        for mode in [*modes] if args.apart else [*modes, CLIENTS]:
            one = instructions(url, folder, mode, 1, distinct, args)
            more = instructions(url, folder, mode, 1 + args.blocks, distinct, args)
            per_turn = (more - one) / turns
            if per_turn <= 0:
                raise SystemExit(
                    f"{mode}: the extra blocks counted no more than one block ({more - one:,} "
                    "instructions): too few turns to count, raise --sessions, --turns or --blocks"
                )
            counted[mode] = per_turn
        if args.apart:
            print_apart({m: [v] for m, v in counted.items()}, "K/turn", 1e-3)
            continue
        base = counted["messages (today)"]
        clients = counted.pop(CLIENTS)
        for mode, per_turn in counted.items():
            own, own_base = per_turn - clients, base - clients
            print(
                f"  {mode:26s} {per_turn / 1000:8.1f} K/turn ({per_turn / base - 1:+.1%})   "
                f"the interception alone {own / 1000:8.1f} K ({own / own_base - 1:+.1%})"
            )
        print(f"  ({CLIENTS}: {clients / 1000:.1f} K/turn, the same sessions to the upstream)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tools", action="store_true", help="send ~12 KB of tool schemas")
    parser.add_argument(
        "--latency",
        type=float,
        default=0.0,
        help="seconds the upstream takes per call (a serving engine's; default 0)",
    )
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        help="a mode to run besides messages (repeatable), e.g. --only 'token-in, local'",
    )
    parser.add_argument(
        "--follow-ups", choices=("both", "same", "distinct"), default="both", dest="follow_ups"
    )
    parser.add_argument(
        "--tokenizer",
        type=Path,
        help="a model's tokenizer folder (tokenizer.json, tokenizer_config.json with its chat "
        "template) for both the interception and the upstream; default: the test's BPE",
    )
    parser.add_argument(
        "--drop-reasoning",
        action="store_true",
        dest="drop_reasoning",
        help="the clients send each reply back without its reasoning_content, as most agents do",
    )
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="count each mode's instructions per turn under valgrind's cachegrind, not CPU time",
    )
    parser.add_argument(
        "--processes",
        type=int,
        default=0,
        help="time CPU in a fresh process per mode and run, this many alternated rounds",
    )
    parser.add_argument(
        "--blocks",
        type=int,
        default=2,
        help="with --instructions or --processes: the blocks counted after the first",
    )
    parser.add_argument(
        "--gc",
        default="vfray",
        choices=["vfray", "python"],
        help="the garbage collector's thresholds: vfray's, as the processes that run its "
        "interception set them (vfray.owned_process), or Python's defaults",
    )
    parser.add_argument(
        "--apart",
        action="store_true",
        help="with --instructions or --processes: the clients in a process of their own, so "
        "the interception's process is measured alone (no clients' share subtracted)",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--clients", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.gc == "vfray":
        tune_owned_process()
    if args.apart and not (args.processes or args.instructions or args.child):
        parser.error("--apart needs --processes N or --instructions")
    if args.clients:
        url, turns, tools, drop_reasoning = json.loads(args.clients)
        asyncio.run(serve_clients(url, turns, tools, drop_reasoning))
        return
    if args.child:
        url, mode, blocks, distinct = json.loads(args.child)
        shape = {"distinct": distinct, "tools": args.tools, "drop_reasoning": args.drop_reasoning}
        if mode == CLIENTS:
            run = clients_alone(url, args.sessions, args.turns, blocks, **shape)
        else:
            settings, options = modes_for(args.tokenizer)[mode]
            run = run_blocks(
                url, settings, options, args.sessions, args.turns, blocks, **shape,
                apart=args.apart,
            )  # fmt: skip
        print(json.dumps({"cpu_ms": asyncio.run(run)}))
        return
    if args.instructions and shutil.which("valgrind") is None:
        raise SystemExit("--instructions needs valgrind (apt install valgrind)")
    kinds = {"both": (False, True), "same": (False,), "distinct": (True,)}[args.follow_ups]
    with tempfile.TemporaryDirectory() as built:
        if args.tokenizer is None:
            build_model(Path(built))
        folder = args.tokenizer or Path(built)
        port = multiprocessing.Value("i", 0)
        server = multiprocessing.Process(
            target=serve, args=(str(folder), port, args.latency), daemon=True
        )
        server.start()
        try:
            while not port.value:
                time.sleep(0.05)
            url = f"http://127.0.0.1:{port.value}/v1"
            modes = modes_for(folder)
            if args.only:
                keep = {"messages (today)", *args.only}
                modes = {m: v for m, v in modes.items() if m in keep}
            if args.instructions:
                count_instructions(url, folder, modes, kinds, args)
                return
            if args.processes:
                compare_processes(url, folder, modes, kinds, args)
                return
            results: dict[tuple[str, bool], list[dict[str, float]]] = {}
            clients: dict[bool, list[float]] = {}
            for repeat in range(args.repeats):
                # Interleaved: drift of the machine's load hits every mode alike; and the order
                # flips every repeat (a repeat's first run measured slower than its second).
                ordered = list(modes.items())
                if repeat % 2:
                    ordered.reverse()
                for distinct in kinds:
                    for mode, (settings, options) in ordered:
                        run = measure(
                            url,
                            settings,
                            args.sessions,
                            args.turns,
                            distinct=distinct,
                            tools=args.tools,
                            drop_reasoning=args.drop_reasoning,
                            server_pid=server.pid,
                            **options,
                        )
                        results.setdefault((mode, distinct), []).append(asyncio.run(run))
                    alone = clients_alone(
                        url, args.sessions, args.turns, distinct=distinct, tools=args.tools,
                        drop_reasoning=args.drop_reasoning,
                    )  # fmt: skip
                    clients.setdefault(distinct, []).append(asyncio.run(alone))
        finally:
            server.kill()
    head = f"{args.sessions} sessions x {args.turns} turns, median of {args.repeats}"
    tools = f", {len(json.dumps(TOOLS)) // 1000} KB of tools per call" if args.tools else ""
    print(
        f"{head}{tools} (cpu: this process, median and best run; upstream: the server's; "
        "TokenIn.prompt: its CPU per turn, the branch found and the bridge built)"
    )
    for distinct in kinds:
        kind = "distinct follow-ups per session" if distinct else "the same follow-ups"
        print(f" {kind}:")
        base_runs = results[("messages (today)", distinct)]
        base = statistics.median(r["cpu_ms"] for r in base_runs)
        base_best = min(r["cpu_ms"] for r in base_runs)
        base_wall = statistics.median(r["wall_ms"] for r in base_runs)
        base_up = statistics.median(r["upstream_ms"] for r in base_runs)
        for mode in modes:
            runs = results[(mode, distinct)]
            cpu = statistics.median(r["cpu_ms"] for r in runs)
            best = min(r["cpu_ms"] for r in runs)
            wall = statistics.median(r["wall_ms"] for r in runs)
            up = statistics.median(r["upstream_ms"] for r in runs)
            own = statistics.median(r["prompt_ms"] for r in runs)
            # Each repeat ran every mode back to back: its own ratio to messages follows the
            # machine's load less than the ratio of the medians does.
            paired = statistics.median(
                r["cpu_ms"] / b["cpu_ms"] - 1 for r, b in zip(runs, base_runs, strict=True)
            )
            print(
                f"  {mode:26s} cpu {cpu:6.3f} ms/turn ({cpu / base - 1:+.1%}; "
                f"paired {paired:+.1%}; best {best:.3f}, {best / base_best - 1:+.1%})   "
                f"wall {wall:6.3f} ({wall / base_wall - 1:+.1%})   "
                f"upstream {up:6.3f} ({up / base_up - 1:+.1%})   "
                f"TokenIn.prompt {own:.3f}   "
                f"lost {int(runs[-1]['lost'])} of {int(runs[-1]['samples'])}"
            )
        # The clients' own CPU is the same in every mode: less it, what is left is the
        # interception's, the "today's interception" (paired per repeat again).
        alone = clients[distinct]
        own_base = [b["cpu_ms"] - c for b, c in zip(base_runs, alone, strict=True)]
        line = []
        for mode in modes:
            runs = results[(mode, distinct)]
            own = [r["cpu_ms"] - c for r, c in zip(runs, alone, strict=True)]
            ratio = statistics.median(own) / statistics.median(own_base) - 1
            paired = statistics.median(o / b - 1 for o, b in zip(own, own_base, strict=True))
            line.append(f"{mode} {statistics.median(own):.3f} ({ratio:+.1%}; paired {paired:+.1%})")
        print(
            f"  the interception alone, ms/turn (less the clients' own "
            f"{statistics.median(alone):.3f}, the same sessions to the upstream): "
            + ", ".join(line)
        )
    tokenizer = args.tokenizer or "the test's byte-level BPE, 400 ids"
    print(
        f"(tokenizer: {tokenizer}; gc thresholds {gc.get_threshold()}; cpus: {os.cpu_count()}, "
        f"load {os.getloadavg()[0]:.1f})"
    )


if __name__ == "__main__":
    main()
