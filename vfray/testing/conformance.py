"""``check_runtime``: the contract every :class:`~vfray.runtimes.base.Runtime` must honour.

Run it on your own runtime plugin: ``await check_runtime(lambda: MyRuntime(spec))``. It raises
:class:`AssertionError` naming the first violation. It needs the box's processes to be visible in
this host's ``/proc`` (true for subprocess, bwrap and a local docker engine).

Internal: importable, but not the public API (:mod:`vfray`, :mod:`vfray.testing`,
:mod:`vfray.train`, :mod:`vfray.compat.v1`); names here may move.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Callable
from pathlib import Path

from vfray.runtimes.base import Runtime

FAKE_SECRET_VAR = "OPENAI_API_KEY"


def _processes_with(token: str) -> list[int]:
    """Live processes whose environment or command line contains ``token``."""
    needle = token.encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            blob = (entry / "environ").read_bytes() + (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if needle in blob:
            found.append(int(entry.name))
    return found


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(f"runtime contract violated: {message}")


async def check_runtime(runtime_factory: Callable[[], Runtime]) -> None:
    """Start a fresh runtime from ``runtime_factory`` and check the whole contract on it."""
    token = f"vfray-conformance-{uuid.uuid4().hex}"
    secret = f"sk-{token}"
    previous = os.environ.get(FAKE_SECRET_VAR)
    os.environ[FAKE_SECRET_VAR] = secret
    runtime = runtime_factory()
    try:
        _check(not await runtime.alive(), "alive() is True before start()")
        await runtime.start()
        _check(await runtime.alive(), "alive() is False after start()")
        await _check_files(runtime)
        await _check_run(runtime, secret)
        await _check_timeout(runtime)
        await _check_live(runtime, token)
        await _check_background(runtime, token)
        await _check_interrupt(runtime)
        # A background process the box must take down with it.
        started = await runtime.run(
            ["sh", "-c", "nohup sleep 300 >/dev/null 2>&1 & echo started"],
            {"VFRAY_CONFORMANCE": token},
            timeout=30,
        )
        _check(started.ok and "started" in started.stdout, f"background start failed: {started}")
    finally:
        if previous is None:
            os.environ.pop(FAKE_SECRET_VAR, None)
        else:
            os.environ[FAKE_SECRET_VAR] = previous
        await runtime.stop()
    await runtime.stop()  # idempotent
    _check(not await runtime.alive(), "alive() is True after stop()")
    for _ in range(100):  # processes may take a moment to be reaped after SIGKILL
        left = _processes_with(token)
        if not left:
            break
        await asyncio.sleep(0.02)
    _check(not left, f"processes left behind after stop(): {left}")
    fresh = runtime_factory()
    await fresh.stop()  # stop before start must be safe


async def _check_files(runtime: Runtime) -> None:
    payload = bytes(range(256)) * 64
    await runtime.write("conformance/nested/blob.bin", payload)
    back = await runtime.read("conformance/nested/blob.bin")
    _check(back == payload, f"binary write/read round trip changed the data ({len(back)} bytes)")
    listed = await runtime.run(["cat", "conformance/nested/blob.bin"], timeout=30)
    _check(listed.ok, f"a written file is not visible to programs in the box: {listed}")
    await runtime.write("conformance/exec.sh", b"#!/bin/sh\necho executable\n", mode=0o755)
    ran = await runtime.run(["./conformance/exec.sh"], timeout=30)
    _check(ran.stdout.strip() == "executable", f"write(mode=0o755) not executable: {ran}")
    made = await runtime.run(["sh", "-c", "printf made > conformance/made.txt"], timeout=30)
    _check(made.ok, f"cannot write in the work dir: {made}")
    _check(await runtime.read("conformance/made.txt") == b"made", "read() misses a box's file")
    # A link the box's programs made to a file of the box reads that file, as in the box.
    linked = await runtime.run(
        ["sh", "-c", 'ln -s made.txt conformance/rel && ln -s "$PWD/conformance/made.txt" '
         "conformance/abs"],
        timeout=30,
    )  # fmt: skip
    _check(linked.ok, f"cannot make links in the work dir: {linked}")
    for link in ("conformance/rel", "conformance/abs"):
        _check(await runtime.read(link) == b"made", f"read() of the box's link {link} failed")


async def _check_run(runtime: Runtime, secret: str) -> None:
    result = await runtime.run(
        ["sh", "-c", 'echo "out:$VFRAY_CHECK"; echo "err" >&2; env; exit 7'],
        {"VFRAY_CHECK": "value"},
        timeout=30,
    )
    _check(result.exit_code == 7, f"exit code not reported (got {result.exit_code})")
    _check(not result.ok, "ok is True for a non-zero exit")
    _check("out:value" in result.stdout, f"env not passed or stdout lost: {result.stdout!r}")
    _check(result.stderr.strip() == "err", f"stderr not captured separately: {result.stderr!r}")
    _check(secret not in result.stdout, f"the host's {FAKE_SECRET_VAR} leaked into the box")
    fed = await runtime.run(["cat"], stdin=b"from stdin", timeout=30)
    _check(fed.stdout == "from stdin", f"stdin not delivered: {fed.stdout!r}")
    ok = await runtime.run(["true"], timeout=30)
    _check(ok.ok and ok.exit_code == 0 and not ok.timed_out, f"`true` did not succeed: {ok}")
    missing = await runtime.run(["vfray-no-such-program"], timeout=30)
    _check(missing.exit_code != 0, "a missing program reported success")


ECHO_LOOP = 'while read line; do echo "got:$line:$VFRAY_CHECK"; echo "err:$line" >&2; done; exit 3'
TERM_TRAP = 'trap "echo term; exit 0" TERM; echo ready; while true; do sleep 0.1; done'
TERM_IGNORED = 'trap "" TERM; echo ready; while true; do sleep 0.1; done'


async def _line(stream: asyncio.StreamReader) -> bytes:
    return await asyncio.wait_for(stream.readline(), 30)


async def _check_live(runtime: Runtime, token: str) -> None:
    """``open_process``: streaming stdio both ways, env and cwd, exit status, stdin EOF, and
    ``stop``'s SIGTERM-then-SIGKILL on a program that obeys and one that ignores SIGTERM."""
    proc = await runtime.open_process(["sh", "-c", ECHO_LOOP], env={"VFRAY_CHECK": "live"})
    for word in ("one", "two"):
        proc.stdin.write(f"{word}\n".encode())
        await proc.stdin.drain()
        got = await _line(proc.stdout)
        _check(got == f"got:{word}:live\n".encode(), f"live stdout/env wrong: {got!r}")
        err = await _line(proc.stderr)
        _check(err == f"err:{word}\n".encode(), f"live stderr wrong: {err!r}")
    proc.stdin.close()
    code = await asyncio.wait_for(proc.wait(), 30)
    _check(code == 3, f"a live process's exit status is not reported (got {code})")
    _check(proc.returncode == 3, f"returncode after wait is {proc.returncode}")
    _check(await proc.stop() == 3, "stop() after exit does not return the exit status")

    await runtime.run(["mkdir", "-p", "live/sub"], timeout=30)
    where = await runtime.open_process(["pwd"], cwd="live/sub")
    pwd = await _line(where.stdout)
    _check(pwd.rstrip().endswith(b"/live/sub"), f"open_process(cwd=) not applied: {pwd!r}")
    await asyncio.wait_for(where.wait(), 30)

    polite = await runtime.open_process(["sh", "-c", TERM_TRAP], env={"VFRAY_CONFORMANCE": token})
    _check(await _line(polite.stdout) == b"ready\n", "a live process did not start")
    code = await asyncio.wait_for(polite.stop(grace=20), 60)
    _check(code == 0, f"SIGTERM did not reach a live process's trap (status {code})")
    _check(b"term" in await polite.stdout.read(), "the SIGTERM trap's output is lost")

    stubborn = await runtime.open_process(
        ["sh", "-c", TERM_IGNORED], env={"VFRAY_CONFORMANCE": token}
    )
    _check(await _line(stubborn.stdout) == b"ready\n", "a live process did not start")
    stopping = asyncio.ensure_future(stubborn.stop(grace=0.5))
    code = await asyncio.wait_for(stubborn.stop(grace=0.5), 60)  # idempotent, concurrent
    _check(code != 0 and await stopping == code, f"SIGKILL after the grace failed ({code})")
    for _ in range(100):
        if not _processes_with(token):
            break
        await asyncio.sleep(0.02)
    _check(not _processes_with(token), "a stopped live process left processes behind")

    # One left running: the box's stop() must end it (checked after stop()).
    await runtime.open_process(["sh", "-c", TERM_IGNORED], env={"VFRAY_CONFORMANCE": token})


SERVE = """
import socket, sys
ls = socket.socket()
ls.bind(("127.0.0.1", 0))
ls.listen(8)
print(ls.getsockname()[1], flush=True)
while True:
    conn, _ = ls.accept()
    conn.recv(65536)
    conn.sendall(b"HTTP/1.0 200 OK\\r\\n\\r\\n" + sys.argv[1].encode())
    conn.close()
"""


async def _fetch(url: str) -> bytes:
    host, port = url.removeprefix("http://").rstrip("/").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"GET / HTTP/1.0\r\n\r\n")
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(), 30)
    finally:
        writer.close()


async def _check_background(runtime: Runtime, token: str) -> None:
    """``run_background`` keeps a server running, ``expose`` reaches its port from the host,
    and the server's own output is kept."""
    server = await runtime.run_background(
        [runtime.python, "-c", SERVE, f"served-{token}"], env={"VFRAY_CONFORMANCE": token}
    )
    for _ in range(600):
        if server.stdout.strip() or server.returncode is not None:
            break
        await asyncio.sleep(0.05)
    _check(server.stdout.strip().isdigit(), f"background server did not start: {server.stderr}")
    url = await runtime.expose(int(server.stdout.strip()))
    _check(url.startswith("http://"), f"expose() gave no http URL: {url!r}")
    for _ in range(2):  # two connections: the way in is not single-use
        reply = await _fetch(url)
        _check(f"served-{token}".encode() in reply, f"expose() did not reach the box: {reply!r}")
    # Left running: the box's stop() must end it (checked after stop()).


async def _check_interrupt(runtime: Runtime) -> None:
    """``interrupt`` sends SIGTERM to the programs ``run`` is running (a stopped rollout's
    harness program), which may clean up and exit on their own."""
    trap = 'trap "echo term; exit 0" TERM; touch interrupt.ready; while true; do sleep 0.1; done'
    running = asyncio.ensure_future(runtime.run(["sh", "-c", trap], timeout=120))
    try:
        for _ in range(600):
            if (await runtime.run(["test", "-e", "interrupt.ready"], timeout=30)).ok:
                break
            await asyncio.sleep(0.05)
        await runtime.interrupt()
        result = await asyncio.wait_for(asyncio.shield(running), 60)
    finally:
        running.cancel()
    _check(result.ok and "term" in result.stdout, f"interrupt() did not SIGTERM a run: {result}")


async def _check_timeout(runtime: Runtime) -> None:
    result = await runtime.run(["sh", "-c", "sleep 60; echo finished"], timeout=0.5)
    _check(result.timed_out, f"a run past its timeout is not marked timed_out: {result}")
    _check(not result.ok, "a timed-out run reports ok")
    _check("finished" not in result.stdout, "the timed-out program kept running")
