"""Runtime tests on real processes: conformance, floods, forks, hangs, the bwrap network wall."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from vfray.endpoints.serving import serve_in_loop
from vfray.errors import ConfigError, MissingExtraError, SandboxError
from vfray.runtimes._box_paths import Mount, open_in_box
from vfray.runtimes.base import Runtime, RuntimeSpec
from vfray.runtimes.bwrap import BwrapRuntime, shares_network
from vfray.runtimes.processes import box_env, is_secret
from vfray.runtimes.registry import make_runtime
from vfray.runtimes.strays import marked_pids
from vfray.testing.conformance import check_runtime

HAS_BWRAP = shutil.which("bwrap") is not None
LOCAL = [
    "subprocess",
    pytest.param("bwrap", marks=pytest.mark.skipif(not HAS_BWRAP, reason="no bwrap")),
]

FETCH = """
import sys, urllib.request
try:
    print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())
except Exception as exc:
    print("ERR", type(exc).__name__, exc)
    sys.exit(3)
"""

FORK_IGNORING_TERM = """
import os, signal, time
for _ in range(3):
    if os.fork() == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.setsid()  # leave the process group too: only the box marker or namespace finds it
        time.sleep(300)
        os._exit(0)
print("forked", flush=True)
"""


async def _hello(request: Request) -> PlainTextResponse:
    return PlainTextResponse("hello from host")


APP = Starlette(routes=[Route("/hi", _hello)])


def factory(kind: str, **options: object) -> Callable[[], Runtime]:
    return lambda: make_runtime(kind, RuntimeSpec(), **options)


@pytest.mark.parametrize("kind", LOCAL)
async def test_conformance(kind: str) -> None:
    await check_runtime(factory(kind))


@pytest.mark.parametrize("kind", LOCAL)
async def test_flood_is_truncated_not_hung(kind: str) -> None:
    async with make_runtime(kind, output_cap=4096) as rt:
        script = (
            "import sys\nfor i in range(200000): sys.stdout.write('x' * 99 + '\\n')\nprint('END')"
        )
        result = await rt.run([sys.executable, "-c", script], timeout=60)
    assert result.ok and result.truncated
    assert len(result.stdout) == 4096 and result.stdout.endswith("END\n")


@pytest.mark.parametrize("kind", LOCAL)
async def test_forked_children_ignoring_sigterm_die_on_stop(kind: str) -> None:
    rt = make_runtime(kind)
    await rt.start()
    box_id = rt.box_id  # type: ignore[attr-defined]
    result = await rt.run([sys.executable, "-c", FORK_IGNORING_TERM], timeout=30)
    assert "forked" in result.stdout
    await rt.stop()
    for _ in range(500):  # bounded generously: a loaded CI machine reaps slowly
        if not marked_pids(box_id):
            break
        await asyncio.sleep(0.02)
    assert marked_pids(box_id) == []


@pytest.mark.parametrize("kind", LOCAL)
async def test_hang_times_out(kind: str) -> None:
    async with make_runtime(kind) as rt:
        result = await rt.run([sys.executable, "-c", "import time; time.sleep(300)"], timeout=0.5)
    assert result.timed_out and not result.ok


@pytest.mark.parametrize("kind", LOCAL)
async def test_uv_script_without_dependencies(kind: str) -> None:
    if shutil.which("uv") is None:
        pytest.skip("uv is not installed (pip install uv)")
    script = "# /// script\n# dependencies = []\n# ///\nimport sys\nprint('uv', sys.argv[1])\n"
    async with make_runtime(kind) as rt:
        result = await rt.run_uv_script(script, ["ok"], timeout=120)
    assert result.ok, result.stderr
    assert result.stdout.strip() == "uv ok"


async def test_a_prepared_uv_script_runs_with_no_index() -> None:
    # v1's gsm8k: setup installs the scorer's dependency while the box has network, the reward
    # runs it after the network is cut. The script comes as bytes, as v1 passes it.
    if shutil.which("uv") is None:
        pytest.skip("uv is not installed (pip install uv)")
    script = (
        b"# /// script\n# dependencies = ['six==1.16.0']\n# ///\n"
        b"import sys, six\nprint('six', six.__version__, sys.argv[1])\n"
    )
    async with make_runtime("subprocess") as rt:
        await rt.prepare_uv_script(script, timeout=300)
        result = await rt.run_uv_script(script, ["ok"], env={"UV_OFFLINE": "1"}, timeout=120)
        assert result.ok, result.stderr
        assert result.stdout.strip() == "six 1.16.0 ok"
        # Not prepared: offline, uv cannot get the other version, and says so.
        other = script.replace(b"1.16.0", b"1.15.0")
        missed = await rt.run_uv_script(other, ["ok"], env={"UV_OFFLINE": "1"}, timeout=120)
        assert not missed.ok


@pytest.mark.skipif(not HAS_BWRAP, reason="no bwrap")
async def test_preparing_a_uv_script_in_a_box_without_network_is_one_line() -> None:
    if shutil.which("uv") is None:
        pytest.skip("uv is not installed (pip install uv)")
    script = "# /// script\n# dependencies = ['six==1.16.0']\n# ///\nimport six\n"
    async with make_runtime("bwrap") as rt:
        with pytest.raises(SandboxError, match="uv could not install the script's dependencies: "):
            await rt.prepare_uv_script(script, timeout=120)


async def test_subprocess_scrubs_and_keeps_env() -> None:
    env = box_env(
        {"PATH": "/bin", "OPENAI_API_KEY": "k", "AWS_REGION": "x", "LANG": "C"}, "/w", "m"
    )
    assert env == {"PATH": "/bin", "LANG": "C", "HOME": "/w", "VFRAY_BOX_ID": "m"}
    assert is_secret("HF_TOKEN") and is_secret("my_api_key") and not is_secret("PATH")


@pytest.mark.skipif(not HAS_BWRAP, reason="no bwrap")
async def test_bwrap_box_reaches_bridged_url_but_not_other_host_ports() -> None:
    async with serve_in_loop(APP) as model, serve_in_loop(APP) as other, BwrapRuntime() as rt:
        url = await rt.host_url(model)
        await rt.prepare_execution([url])
        reached = await rt.run([sys.executable, "-c", FETCH, f"{url}/hi"], timeout=30)
        refused = await rt.run([sys.executable, "-c", FETCH, f"{other}/hi"], timeout=30)
    assert reached.stdout.strip() == "hello from host", reached
    assert refused.exit_code == 3 and "Connection refused" in refused.stdout


@pytest.mark.skipif(not HAS_BWRAP, reason="no bwrap")
async def test_bwrap_shares_network_only_when_asked() -> None:
    assert not shares_network(RuntimeSpec(), None)
    # Named hosts go through the node's egress proxy (tests/test_egress.py), never the host's
    # whole network.
    assert not shares_network(RuntimeSpec(network_allow=("pypi.org",)), None)
    assert not shares_network(RuntimeSpec(network_block=("10.0.0.0/8",)), True)
    assert not shares_network(RuntimeSpec(network_allow=("pypi.org",)), False)
    async with serve_in_loop(APP) as other, BwrapRuntime(share_network=True) as rt:
        reached = await rt.run([sys.executable, "-c", FETCH, f"{other}/hi"], timeout=30)
    assert reached.ok, reached


@pytest.mark.skipif(not HAS_BWRAP, reason="no bwrap")
async def test_bwrap_filesystem_is_read_only_outside_the_box() -> None:
    async with BwrapRuntime() as rt:
        denied = await rt.run(["sh", "-c", "echo x > /usr/vfray-escape"], timeout=30)
        tmp = await rt.run(["sh", "-c", "echo kept > /tmp/t"], timeout=30)
        assert await rt.read("/tmp/t") == b"kept\n"
    assert denied.exit_code != 0 and tmp.ok


def test_unknown_runtime_suggests_near_match() -> None:
    with pytest.raises(ConfigError, match="did you mean 'bwrap'"):
        make_runtime("bwarp")
    with pytest.raises(ConfigError, match="bad options"):
        make_runtime("subprocess", no_such_option=1)


async def test_modal_without_the_sdk_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    # CI installs the SDK (for tests/test_runtime_modal.py); a None entry makes its import
    # fail here as it does where the extra is not installed.
    monkeypatch.setitem(sys.modules, "modal", None)
    rt = make_runtime("modal", RuntimeSpec(cpu=2, memory_gb=1.5))
    with pytest.raises(MissingExtraError, match=r"pip install 'vfray\[modal\]'"):
        await rt.start()
    await rt.stop()


async def test_modal_argument_mapping() -> None:
    rt = make_runtime(
        "modal",
        RuntimeSpec(cpu=2, memory_gb=1.5, image="img:1"),
        public_base_url="https://x.example/p",
    )
    assert rt.create_options() == {  # type: ignore[attr-defined]
        "timeout": 3600,
        "workdir": "/work",
        "cpu": (2.0, 2.0),  # (request, limit): the task's resources are hard limits
        "block_network": True,
        "memory": (1536, 1536),
    }
    assert rt.image == "img:1"  # type: ignore[attr-defined]
    assert await rt.host_url("http://127.0.0.1:8000/v1?a=1") == "https://x.example/p/v1?a=1"
    with pytest.raises(ConfigError, match="public_base_url"):
        await make_runtime("modal").host_url("http://127.0.0.1:1/v1")
    exposing = make_runtime("modal", exposed_ports=[8000])
    assert exposing.create_options()["encrypted_ports"] == [8000]  # type: ignore[attr-defined]


@pytest.mark.parametrize("kind", LOCAL)
async def test_box_starts_and_stops_while_the_default_executor_is_full(kind: str) -> None:
    # Blocking sync hooks fill asyncio's default executor (at most 32 workers); the box's own
    # blocking work (file I/O, the stray sweep, removing its dir) must not queue behind them.
    release = threading.Event()
    loop = asyncio.get_running_loop()
    blockers = [loop.run_in_executor(None, release.wait) for _ in range(40)]

    async def lifecycle() -> bytes:
        async with make_runtime(kind) as rt:
            await rt.write("f.txt", b"data")
            ran = await rt.run(["cat", "f.txt"], timeout=30)
            assert ran.stdout == "data", ran
            return await rt.read("f.txt")

    job = asyncio.ensure_future(lifecycle())
    try:
        done, _ = await asyncio.wait({job}, timeout=60)
    finally:
        release.set()  # lets a starved box finish, so the test fails instead of hanging
        await asyncio.gather(*blockers)
    assert job in done, "the box waited for asyncio's default executor"
    assert job.result() == b"data"


@pytest.mark.skipif(not HAS_BWRAP, reason="no bwrap")
async def test_bwrap_live_process_behind_the_bridge_gets_sigterm() -> None:
    """In a denied box with a bridged host endpoint the program runs under the in-box
    forwarder: stop()'s SIGTERM must reach the program's own trap, not end the box first."""
    async with serve_in_loop(APP) as url, BwrapRuntime(RuntimeSpec()) as box:
        await box.prepare_execution([url])
        proc = await box.open_process(
            [sys.executable, "-c", FETCH, f"{url}/hi"],
        )
        assert (await proc.stdout.readline()).strip() == b"hello from host"
        assert await proc.wait() == 0
        trap = 'trap "echo term; exit 0" TERM; echo ready; while true; do sleep 0.1; done'
        proc = await box.open_process(["sh", "-c", trap])
        assert await proc.stdout.readline() == b"ready\n"
        assert await proc.stop(grace=20) == 0
        assert b"term" in await proc.stdout.read()


LOOKUP = """
import socket, sys, urllib.request
try:
    socket.getaddrinfo(sys.argv[1], 443)
    print("dns ok")
except socket.gaierror as exc:
    print("dns", exc.errno == socket.EAI_NONAME)
try:
    urllib.request.urlopen(f"https://{sys.argv[1]}/", timeout=60)
except OSError as exc:
    print("https failed")
"""


@pytest.mark.skipif(not HAS_BWRAP, reason="no bwrap")
async def test_phone_home_lookups_fail_at_once_in_a_box_without_network() -> None:
    """A real program's DNS and HTTPS lookups in a denied box fail as an unknown name (not a
    "temporary" failure that agents retry), and fast: the hang check below is generous."""
    async with BwrapRuntime(RuntimeSpec()) as box:
        # The agent phase (setup reaches hosts through the node's egress proxy), whose proxy
        # refuses the CONNECT: no lookup or connection leaves the node.
        await box.prepare_execution([])
        result = await box.run([sys.executable, "-c", LOOKUP, "pypi.org"], timeout=60)
        assert result.ok and result.stdout.split("\n")[:2] == ["dns True", "https failed"], result
        assert not result.timed_out
        assert result.duration < 30, result.duration  # a hang check, not a performance bound
        env = await box.run(["env"], timeout=30)
    assert "SSL_CERT_FILE" not in env.stdout
    proxies = [
        line
        for line in env.stdout.splitlines()
        if "PROXY=" in line.upper() and "NO_PROXY=" not in line.upper()
    ]
    # Only the box's own egress proxy, never the host's.
    assert proxies and all(p.endswith("=http://127.0.0.1:3128") for p in proxies), proxies


@pytest.mark.parametrize("kind", LOCAL)
async def test_boxes_with_network_get_tls_roots_and_proxies(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    monkeypatch.setenv("no_proxy", "localhost")
    options = {"share_network": True} if kind == "bwrap" else {}
    async with make_runtime(kind, RuntimeSpec(), **options) as box:
        result = await box.run(["env"], timeout=30)
    seen = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
    assert seen["HTTPS_PROXY"] == "http://proxy.invalid:3128" and seen["no_proxy"] == "localhost"
    assert os.path.isfile(seen["SSL_CERT_FILE"]) and seen["NODE_EXTRA_CA_CERTS"]


LINKS_OUT = """
set -e
ln -s /root/vfray-host-secret/key leak           # a host file the box cannot see
ln -s /root/vfray-host-written planted           # where a host write would land
ln -s /root up                                   # a dir out of the box
ln -s ../../../../root/vfray-host-secret/key climb
mkdir -p sub && ln -s ../leak sub/again          # a link to a link out
echo in-the-box > /tmp/answer
ln -s /tmp/answer answer.txt                     # absolute, to the box's own /tmp
ln -s sub/../kept relative && echo kept > kept   # relative, with .. inside the box
ln -s loop1 loop2 && ln -s loop2 loop1
"""


@pytest.mark.skipif(not HAS_BWRAP, reason="no bwrap")
async def test_a_link_the_box_made_never_leads_a_host_read_or_write_out_of_it(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """vfray reads a box's files (a reward's answer file) and writes them (a harness's next
    prompt) from the host, as the node's user: a link the box made is followed as the box
    would follow it, and one that leads out of the box's writable dirs is refused (before:
    the host read /root's files through it, and wrote where it pointed)."""
    secret = Path("/root/vfray-host-secret")
    if os.geteuid() != 0:
        secret = tmp_path_factory.mktemp("host") / "vfray-host-secret"
    secret.mkdir(exist_ok=True)
    (secret / "key").write_text("HOST SECRET\n")
    written = secret.parent / "vfray-host-written"
    written.unlink(missing_ok=True)
    try:
        async with BwrapRuntime() as rt:
            made = await rt.run(["sh", "-c", LINKS_OUT.replace("/root", str(secret.parent))])
            assert made.ok, made
            for name in ("leak", "up/vfray-host-secret/key", "climb", "sub/again"):
                with pytest.raises(SandboxError, match="outside the box's writable dirs"):
                    await rt.read(name)
            with pytest.raises(SandboxError, match="outside the box's writable dirs"):
                await rt.write("planted", b"from the host")
            with pytest.raises(SandboxError, match="outside the box's writable dirs"):
                await rt.write("up/vfray-host-written", b"from the host")
            assert not written.exists()
            # Links that stay in the box read what the box reads through them.
            assert await rt.read("answer.txt") == b"in-the-box\n"
            assert await rt.read("relative") == b"kept\n"
            with pytest.raises(SandboxError, match="symbolic links"):
                await rt.read("loop1")
            await rt.write("answer.txt", b"rewritten\n")
            seen = await rt.run(["cat", "/tmp/answer"])
            assert seen.stdout == "rewritten\n"
            await rt.write("deep/er/file", b"x")  # parent dirs still made
            assert (await rt.run(["cat", "deep/er/file"])).stdout == "x"
    finally:
        shutil.rmtree(secret, ignore_errors=True)
        written.unlink(missing_ok=True)


def test_open_in_box_follows_links_as_the_box_does(tmp_path: Path) -> None:
    """The walk on its own: a box with its work dir mounted at /tmp/work over its /tmp."""
    tmp, work = tmp_path / "tmp", tmp_path / "work"
    (tmp / "work").mkdir(parents=True)  # what the work dir's mount hides
    work.mkdir()
    (tmp / "work" / "hidden").write_text("under the mount")
    (tmp / "t").write_text("box tmp")
    mounts = (Mount("/tmp", str(tmp)), Mount("/tmp/work", str(work)))

    def read(path: str) -> str:
        fd = open_in_box(mounts, path, os.O_RDONLY, cwd="/tmp/work")
        with os.fdopen(fd) as f:
            return f.read()

    os.symlink("/tmp/t", work / "abs")
    os.symlink("../t", work / "rel")  # up out of the work dir's mount, into /tmp's
    os.symlink("hidden", work / "under")
    os.symlink(str(tmp / "t"), work / "host-name")  # the host's name for it: not the box's
    os.symlink("/etc/passwd", work / "out")
    assert read("abs") == read("rel") == read("/tmp/work/../t") == "box tmp"
    with pytest.raises(FileNotFoundError):
        read("under")  # the box sees its work dir over /tmp/work, never what it hides
    with pytest.raises(FileNotFoundError if str(tmp).startswith("/tmp/") else SandboxError):
        read("host-name")
    with pytest.raises(SandboxError):
        read("out")
    with pytest.raises(SandboxError):
        read("/etc/passwd")
    with pytest.raises(IsADirectoryError):
        read("/tmp")
    fd = open_in_box(
        mounts, "a/b/c", os.O_WRONLY | os.O_CREAT, 0o600, cwd="/tmp/work", make_parents=True
    )
    os.close(fd)
    assert (work / "a" / "b" / "c").is_file()
    assert os.stat(work / "a" / "b" / "c").st_mode & 0o777 == 0o600


@pytest.mark.parametrize("kind", LOCAL)
async def test_a_fifo_in_the_box_never_stalls_the_event_loop(kind: str) -> None:
    """Small files are read and written on the loop itself (no thread hop); a FIFO the box's
    programs put where vfray reads or writes must still go to a thread and wait there, while
    the loop runs on. Regular files keep their bytes and modes, a new 0o600 file included."""
    rt = factory(kind)()
    await rt.start()
    try:
        await rt.write("key", b"secret", mode=0o600)
        await rt.write("prog", b"#!/bin/sh\n", mode=0o755)
        assert (os.stat(rt.resolve("key")).st_mode & 0o777, await rt.read("key")) == (
            0o600,
            b"secret",
        )
        assert os.stat(rt.resolve("prog")).st_mode & 0o777 == 0o755
        os.mkfifo(rt.resolve("pipe"))
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        ticker = asyncio.ensure_future(tick())
        reading = asyncio.ensure_future(rt.read("pipe"))
        await asyncio.sleep(0.3)
        assert not reading.done() and ticks >= 10
        with open(rt.resolve("pipe"), "wb") as writer:  # the thread's read ends
            writer.write(b"from the box")
        assert await asyncio.wait_for(reading, 10) == b"from the box"
        ticks = 0
        writing = asyncio.ensure_future(rt.write("pipe", b"to the box"))
        await asyncio.sleep(0.3)
        assert not writing.done() and ticks >= 10
        with open(rt.resolve("pipe"), "rb") as reader:
            assert reader.read() == b"to the box"
        await asyncio.wait_for(writing, 10)
        ticker.cancel()
    finally:
        await rt.stop()
