"""Network policy, enforced (issue 28 item 3), on real bwrap and docker boxes: setup reaches
any host, the agent phase only its ``network_allow`` hosts, ``network_block`` never, and the
interception stays reachable in both phases.

The "internet" is a network namespace the test makes (a veth pair to it from this one), with
an HTTP server answering on two addresses of it, ALLOWED and OTHER, and a tiny package index;
no traffic ever leaves the machine."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
import zipfile
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

import vfray as vf
from vfray.endpoints.serving import serve_in_loop
from vfray.errors import ConfigError
from vfray.runtimes.base import Runtime, RuntimeSpec
from vfray.runtimes.bwrap import BwrapRuntime
from vfray.runtimes.egress import EGRESS_PORT, node_proxy
from vfray.runtimes.network_policy import HostRule, box_network, check_resolvable

PORT = 8080
PYTHON = "/usr/bin/python3"  # the system Python has pip, in bwrap and in the test image


@dataclass
class Far:
    """A network namespace answering HTTP on ``allowed`` and ``other`` (both its own)."""

    netns: str
    allowed: str
    other: str

    def url(self, host: str, path: str = "/hello.txt") -> str:
        return f"http://{host}:{PORT}{path}"


def _sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


def _wheel() -> tuple[str, bytes]:
    """A one-module wheel, ``tinypkg`` 1.0."""
    name = "tinypkg-1.0-py3-none-any.whl"
    files = {
        "tinypkg/__init__.py": "WHERE = 'the far index'\n",
        "tinypkg-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n",
        "tinypkg-1.0.dist-info/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = "".join(f"{path},,\n" for path in files) + "tinypkg-1.0.dist-info/RECORD,,\n"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as wheel:
        for path, text in {**files, "tinypkg-1.0.dist-info/RECORD": record}.items():
            wheel.writestr(path, text)
    return name, buffer.getvalue()


@pytest.fixture(scope="module")
def far() -> Iterator[Far]:
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("bwrap") is None:
        pytest.skip("needs root, iproute2 and bubblewrap")
    tag = uuid.uuid4().hex[:6]
    ns, host_end, far_end = f"vfeg-{tag}", f"vfeh{tag}", f"vfef{tag}"
    octet = int(tag[:2], 16) % 200 + 20
    net = f"10.214.{octet}"
    root = Path(tempfile.mkdtemp(prefix="vfray-far-"))
    (root / "hello.txt").write_text("hello from far\n")
    name, wheel = _wheel()
    (root / name).write_bytes(wheel)
    (root / "simple" / "tinypkg").mkdir(parents=True)
    (root / "simple" / "tinypkg" / "index.html").write_text(f'<a href="../../{name}">{name}</a>')
    server: subprocess.Popen[bytes] | None = None
    _sh("ip", "netns", "add", ns)
    try:
        _sh("ip", "link", "add", host_end, "type", "veth", "peer", "name", far_end)
        _sh("ip", "link", "set", far_end, "netns", ns)
        _sh("ip", "addr", "add", f"{net}.1/24", "dev", host_end)
        _sh("ip", "link", "set", host_end, "up")
        for last in (2, 3):
            _sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{net}.{last}/24", "dev", far_end)
        _sh("ip", "netns", "exec", ns, "ip", "link", "set", far_end, "up")
        _sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        server = subprocess.Popen(
            [
                *("ip", "netns", "exec", ns, sys.executable, "-m", "http.server", str(PORT)),
                *("--bind", "0.0.0.0", "--directory", str(root)),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection((f"{net}.2", PORT), 1).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the far HTTP server did not start") from None
                time.sleep(0.05)
        yield Far(ns, f"{net}.2", f"{net}.3")
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=10)
        with contextlib.suppress(subprocess.CalledProcessError):
            _sh("ip", "link", "del", host_end)
        _sh("ip", "netns", "del", ns)
        shutil.rmtree(root, ignore_errors=True)


async def _interception(request: Request) -> PlainTextResponse:
    return PlainTextResponse("interception here")


@contextlib.asynccontextmanager
async def interception() -> AsyncIterator[str]:
    async with serve_in_loop(Starlette(routes=[Route("/v1", _interception)])) as url:
        yield url


def bwrap_box(spec: RuntimeSpec, **options: object) -> Runtime:
    return BwrapRuntime(spec, **options)  # type: ignore[arg-type]


def docker_box(url: str) -> Callable[..., Runtime]:
    from docker_engine import IMAGE, VOLUMES

    from vfray.runtimes.docker import DockerRuntime

    def make(spec: RuntimeSpec, **options: object) -> Runtime:
        spec = spec.model_copy(update={"image": IMAGE})
        return DockerRuntime(spec, base_url=url, volumes=dict(VOLUMES), **options)  # type: ignore[arg-type]

    return make


@pytest.fixture(params=["bwrap", "docker"])
def box(request: pytest.FixtureRequest) -> Callable[..., Runtime]:
    if request.param == "bwrap":
        return bwrap_box
    return docker_box(request.getfixturevalue("docker_url"))


async def curl(rt: Runtime, url: str, *flags: str) -> tuple[int, str]:
    done = await rt.run(["curl", "-sS", "--max-time", "20", *flags, url], timeout=60)
    return done.exit_code, done.stdout + done.stderr


async def pip_install(rt: Runtime, far: Far, host: str) -> tuple[int, str]:
    target = f"/tmp/site-{uuid.uuid4().hex[:6]}"
    argv = [PYTHON, "-m", "pip", "install", "--no-cache-dir", "--disable-pip-version-check"]
    argv += ["--retries", "0", "--timeout", "20", "--target", target, "tinypkg"]
    argv += ["--index-url", f"http://{host}:{PORT}/simple", "--trusted-host", host]
    done = await rt.run(argv, timeout=120)
    if done.exit_code != 0:
        return done.exit_code, done.stdout + done.stderr
    check = await rt.run(
        [PYTHON, "-c", "import tinypkg; print(tinypkg.WHERE)"], {"PYTHONPATH": target}
    )
    return check.exit_code, check.stdout + check.stderr


async def test_setup_installs_and_the_agent_reaches_only_its_allowed_host(
    far: Far, box: Callable[..., Runtime]
) -> None:
    async with interception() as host_url:
        rt = box(RuntimeSpec(network_allow=(far.allowed,)))
        async with rt:
            # Setup: any host (the far index included), and the interception.
            url = await rt.host_url(host_url)
            assert await curl(rt, far.url(far.other)) == (0, "hello from far\n")
            assert await curl(rt, f"{url}/v1") == (0, "interception here")
            code, said = await pip_install(rt, far, far.other)
            assert (code, said.strip()) == (0, "the far index"), said
            await rt.prepare_execution([url])
            # The agent: its allowed host, plain and through CONNECT; nothing else.
            assert await curl(rt, far.url(far.allowed)) == (0, "hello from far\n")
            assert await curl(rt, far.url(far.allowed), "--proxytunnel") == (0, "hello from far\n")
            code, said = await curl(rt, far.url(far.other))
            assert f"{far.other}:{PORT} is not in network_allow ({far.allowed})" in said, said
            code, said = await curl(rt, far.url(far.other), "--proxytunnel")
            assert code != 0 and "403" in said, said
            code, said = await pip_install(rt, far, far.other)
            assert code != 0 and "No matching distribution" in said, said
            # Around the proxy: the box has no route of its own.
            code, said = await curl(rt, far.url(far.other), "--noproxy", "*")
            assert code != 0 and "from far" not in said
            assert await curl(rt, f"{url}/v1") == (0, "interception here")
            gate = rt.egress  # type: ignore[attr-defined]
            assert gate is not None and any(far.other in why for why in gate.refused)
            sock = gate.path  # none where the box's own namespace has the gate's listener
            assert sock.exists() == (getattr(rt, "netns", None) is None)
            assert gate in node_proxy().gates
        # Nothing left behind: the gate's socket and its place in the node's proxy.
        assert not sock.exists() and gate not in node_proxy().gates


async def test_the_default_agent_phase_has_no_network(
    far: Far, box: Callable[..., Runtime]
) -> None:
    async with interception() as host_url, box(RuntimeSpec()) as rt:
        url = await rt.host_url(host_url)
        assert await curl(rt, far.url(far.allowed)) == (0, "hello from far\n")
        await rt.prepare_execution([url])
        _code, said = await curl(rt, far.url(far.allowed))
        assert "not in network_allow (no host) in the agent phase" in said, said
        # Refused by name, before any lookup (a lookup would have said "does not resolve").
        _code, said = await curl(rt, "http://pkg.mirror.example/")
        assert "pkg.mirror.example:80 is not in network_allow (no host)" in said, said
        assert await curl(rt, f"{url}/v1") == (0, "interception here")


async def test_network_block_is_refused_even_under_allow_all(
    far: Far, box: Callable[..., Runtime]
) -> None:
    spec = RuntimeSpec(network_block=(far.other,))
    async with box(spec, share_network=True) as rt:
        for phase in ("setup", "agent"):
            assert await curl(rt, far.url(far.allowed)) == (0, "hello from far\n"), phase
            _code, said = await curl(rt, far.url(far.other))
            assert f"{far.other} ({far.other}) is in network_block" in said, (phase, said)
            await rt.prepare_execution([])


async def test_the_setup_phase_cannot_reach_the_node_itself(far: Far) -> None:
    async with interception() as host_url, bwrap_box(RuntimeSpec()) as rt:
        # Only bridged endpoints reach the node: not its loopback, not its own addresses.
        _code, said = await curl(rt, host_url + "/v1", "--noproxy", "")
        assert "is the node's own or a link-local address" in said, said
        _code, said = await curl(rt, f"http://{far.allowed[:-1]}1:{PORT}/")
        assert "is the node's own or a link-local address" in said, said


_TUNNEL = """
import socket, sys
s = socket.create_connection(("127.0.0.1", 3128))
s.sendall(f"CONNECT {sys.argv[1]} HTTP/1.1\\r\\n\\r\\n".encode())
print(s.recv(4096).decode().splitlines()[0], flush=True)
print("cut" if s.recv(4096) == b"" else "open", flush=True)
"""


async def test_a_tunnel_opened_in_setup_is_cut_when_the_agent_starts(far: Far) -> None:
    async with BwrapRuntime(RuntimeSpec()) as rt:
        tunnel = await rt.open_process(
            [rt.python, "-I", "-S", "-c", _TUNNEL, f"{far.allowed}:{PORT}"]
        )
        assert (await tunnel.stdout.readline()).startswith(b"HTTP/1.1 200")
        await rt.prepare_execution([])
        assert await tunnel.stdout.readline() == b"cut\n"
        assert await tunnel.wait() == 0


PY = sys.executable


def _no_network(code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a network namespace of its own: every DNS lookup fails at once (no
    route to any nameserver), so nothing is asked of a real resolver."""
    return subprocess.run(
        ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$0" -c "$1"', PY, code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=str(Path(__file__).parent.parent),
    )


def test_an_allowed_host_that_does_not_resolve_is_refused_before_and_during_the_run() -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare")
    driver = _no_network(
        "from vfray.runtimes.network_policy import check_resolvable\n"
        "try:\n"
        "    check_resolvable(['localhost', 'pkg.mirror.example', '10.0.0.0/8'], 'task t1')\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    assert driver.stdout.strip() == (
        "ConfigError task t1: network_allow host pkg.mirror.example does not resolve"
    ), driver
    rollout = _no_network(
        "import asyncio\n"
        "from vfray.runtimes.base import RuntimeSpec\n"
        "from vfray.runtimes._box_pool import POOL\n"
        "from vfray.runtimes.bwrap import BwrapRuntime\n"
        "async def main():\n"
        "    rt = BwrapRuntime(RuntimeSpec(network_allow=('pkg.mirror.example',)))\n"
        "    try:\n"
        "        await rt.start()\n"
        "    except Exception as exc:\n"
        "        print(type(exc).__name__, str(exc).split(': ', 1)[1])\n"
        "    finally:\n"
        "        await rt.stop()\n"
        "    print('left', rt.base.exists() if rt.base else None, POOL.count())\n"
        "asyncio.run(main())\n"
    )
    # Refused before the box's dir, cgroups or namespace are made: nothing left, none kept warm.
    assert rollout.stdout.split("\n")[:2] == [
        "SandboxError network_allow host(s) pkg.mirror.example do not resolve",
        "left None 0",
    ], rollout


def test_a_run_refuses_a_task_whose_allowed_host_does_not_resolve(tmp_path: Path) -> None:
    """The driver's check (RunSpec.check_task, from Farm's task loop): one line, no rollout."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare")
    run = _no_network(
        "import vfray as vf\n"
        "from vfray.errors import ConfigError\n"
        "class T(vf.Task[vf.TaskData]):\n"
        "    @vf.reward\n"
        "    def r(self, trace):\n"
        "        return 1.0\n"
        "data = vf.TaskData(prompt='hi', network_allow=['localhost', 'pkg.mirror.example'])\n"
        "try:\n"
        "    with vf.Farm(model='scripted:echo', harness='null', runtime='bwrap',\n"
        f"                 backend='local', progress=False, output_dir={str(tmp_path)!r}) as f:\n"
        "        f.run([T(data)])\n"
        "    print('ran')\n"
        "except ConfigError as exc:\n"
        "    print('ConfigError', exc)\n"
    )
    said = run.stdout.strip().splitlines()
    assert len(said) == 1 and said[0].startswith("ConfigError task "), run
    assert said[0].endswith(": network_allow host pkg.mirror.example does not resolve"), run


def test_host_rules() -> None:
    assert HostRule.parse("PyPI.org").matches_name("pypi.org", 443)
    wild = HostRule.parse("*.pythonhosted.org")
    assert wild.matches_name("files.pythonhosted.org", 443)
    assert not wild.matches_name("pythonhosted.org.evil", 443)
    port = HostRule.parse("10.1.2.3:8080")
    assert port.network is not None and port.port == 8080
    import ipaddress

    assert HostRule.parse("10.0.0.0/8").matches_address(ipaddress.ip_address("10.9.9.9"), 1)
    assert HostRule.parse("[::1]:80").port == 80
    for bad in ("http://pypi.org", "pypi.org/simple", "a b", "host:x", ""):
        with pytest.raises(ConfigError, match="is not a host"):
            HostRule.parse(bad)
    with pytest.raises(ConfigError, match="is not a host"):
        check_resolvable(["https://x"], "t")


def test_the_policy_of_each_phase() -> None:
    default = box_network(["*"], [], None)
    assert default.proxied and default.setup and default.setup.allow is None
    assert default.agent is not None and default.agent.allow == ()
    assert box_network(["*"], [], True).host_network
    assert not box_network(["*"], [], False).proxied
    assert not box_network(["pypi.org"], ["*"], None).proxied
    blocked = box_network(["*"], ["10.0.0.0/8"], True)
    assert not blocked.host_network and blocked.agent and blocked.agent.allow is None
    named = box_network(["pypi.org", "*.example.com", "10.0.0.1"], [], True)
    assert named.agent and [r.entry for r in named.agent.allow or ()] == [
        "pypi.org",
        "*.example.com",
        "10.0.0.1",
    ]
    assert named.named_hosts == ("pypi.org",)
    assert EGRESS_PORT < 32768


class InstallingTask(vf.Task[vf.TaskData]):
    """Its setup installs ``tinypkg`` from the far index; its reward (scoring runs under the
    agent's policy) checks the install is there and that the same install now fails."""

    index: ClassVar[str] = ""
    said: ClassVar[list[str]] = []

    async def setup(self, trace: vf.Trace, runtime: Runtime) -> None:
        host = self.index
        code, said = await _pip(runtime, host, "/tmp/setup-site")
        if code != 0:
            raise RuntimeError(f"setup could not install: {said}")

    @vf.reward
    async def offline_after_setup(self, trace: vf.Trace, runtime: Runtime) -> float:
        show = [PYTHON, "-c", "import tinypkg; print(tinypkg.WHERE)"]
        kept = await runtime.run(show, {"PYTHONPATH": "/tmp/setup-site"})
        code, said = await _pip(runtime, self.index, "/tmp/agent-site")
        self.said.extend([kept.stdout.strip(), said])
        return float(kept.stdout.strip() == "the far index" and code != 0)


async def _pip(rt: Runtime, host: str, target: str) -> tuple[int, str]:
    argv = [PYTHON, "-m", "pip", "install", "--no-cache-dir", "--disable-pip-version-check"]
    argv += ["--retries", "0", "--timeout", "20", "--target", target, "tinypkg"]
    argv += ["--index-url", f"http://{host}:{PORT}/simple", "--trusted-host", host]
    done = await rt.run(argv, timeout=120)
    return done.exit_code, done.stdout + done.stderr


@pytest.mark.parametrize("runtime", ["bwrap", "docker"])
async def test_a_rollouts_setup_installs_and_its_agent_phase_cannot(
    far: Far, runtime: str, request: pytest.FixtureRequest
) -> None:
    """Through the rollout machine (setup, then prepare_execution, the agent, scoring)."""
    options: dict[str, object] = {}
    data = vf.TaskData(prompt="hi")
    if runtime == "docker":
        from docker_engine import IMAGE, runtime_options

        options = runtime_options(request.getfixturevalue("docker_url"))
        data = vf.TaskData(prompt="hi", image=IMAGE)
    InstallingTask.index = far.other
    InstallingTask.said.clear()
    trace = await vf.run_rollout(
        InstallingTask(data),
        model="scripted:echo",
        harness="null",
        runtime=runtime,
        runtime_options=options,
    )
    assert not trace.errors, trace.errors
    assert trace.reward == 1.0, InstallingTask.said
