"""Docker runtime tests against a ``dockerd`` this module starts by hand (skipped without one)."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from vfray.runtimes.base import Runtime, RuntimeSpec
from vfray.runtimes.docker import DockerRuntime
from vfray.serving import serve_in_loop
from vfray.testing.conformance import check_runtime

pytestmark = pytest.mark.docker
IMAGE = "vfray-test:latest"
PYTHON_ROOT = os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))


def _rootfs() -> bytes:
    """An almost empty rootfs; /usr and the host Python are bind-mounted read-only instead."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name in ("bin", "sbin", "lib", "lib64"):
            link = tarfile.TarInfo(name)
            link.type, link.linkname = tarfile.SYMTYPE, f"usr/{name}"
            tar.addfile(link)
        for name in ("usr", "etc", "tmp", "work", "root", "proc", "sys", "dev"):
            folder = tarfile.TarInfo(name)
            folder.type, folder.mode = tarfile.DIRTYPE, 0o1777 if name == "tmp" else 0o755
            tar.addfile(folder)
        passwd = b"root:x:0:0:root:/root:/bin/sh\n"
        entry = tarfile.TarInfo("etc/passwd")
        entry.size = len(passwd)
        tar.addfile(entry, io.BytesIO(passwd))
    return buffer.getvalue()


@pytest.fixture(scope="module")
def docker_url() -> Iterator[str]:
    dockerd = shutil.which("dockerd")
    if dockerd is None or shutil.which("docker") is None or os.geteuid() != 0:
        pytest.skip(
            "no engine: dockerd/docker not installed (apt-get install docker.io) or not root"
        )
    pytest.importorskip("docker", reason="the docker SDK is missing (pip install 'vfray[docker]')")
    root = Path(tempfile.mkdtemp(prefix="vfray-dockerd-"))
    url = f"unix://{root}/docker.sock"
    log = open(root / "dockerd.log", "wb")  # noqa: SIM115 - lives as long as the daemon
    proc = subprocess.Popen(
        [
            dockerd, "--host", url, "--data-root", str(root / "data"),
            "--exec-root", str(root / "exec"), "--pidfile", str(root / "docker.pid"),
            "--bridge=none", "--iptables=false", "--ip6tables=false",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while subprocess.run(["docker", "-H", url, "info"], capture_output=True).returncode:
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.skip(
                    f"no engine: dockerd did not start: {(root / 'dockerd.log').read_text()[-500:]}"
                )
            time.sleep(0.2)
        env = "ENV PATH=" + os.path.dirname(os.path.realpath(sys.executable)) + ":/usr/bin:/bin"
        made = subprocess.run(
            ["docker", "-H", url, "import", "-c", env, "-", IMAGE],
            input=_rootfs(),
            capture_output=True,
        )
        if made.returncode:
            pytest.skip(f"no engine: cannot import the test image: {made.stderr.decode()}")
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        with contextlib.suppress(OSError):
            subprocess.run(["umount", "-R", str(root)], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def docker_factory(url: str, **spec: object) -> Callable[[], Runtime]:
    mounts = {"/usr": "/usr", PYTHON_ROOT: PYTHON_ROOT}
    return lambda: DockerRuntime(
        RuntimeSpec(image=IMAGE, **spec),
        base_url=url,
        volumes=mounts,
    )


async def test_docker_conformance(docker_url: str) -> None:
    await check_runtime(docker_factory(docker_url, memory_gb=0.5, cpu=1.0))


async def _hello(request: Request) -> PlainTextResponse:
    return PlainTextResponse("hello from host")


FETCH = """
import sys, urllib.request
try:
    print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())
except Exception as exc:
    print("ERR", type(exc).__name__, exc)
    sys.exit(3)
"""


async def test_docker_network_none_with_bridge(docker_url: str) -> None:
    app = Starlette(routes=[Route("/hi", _hello)])
    async with serve_in_loop(app) as model, serve_in_loop(app) as other:
        rt = docker_factory(docker_url)()
        async with rt:
            url = await rt.host_url(model)
            reached = await rt.run(["python3", "-c", FETCH, f"{url}/hi"], timeout=30)
            refused = await rt.run(["python3", "-c", FETCH, f"{other}/hi"], timeout=30)
            flood = await rt.run(["python3", "-c", "print('y' * 200000)"], timeout=30)
    assert reached.stdout.strip() == "hello from host", reached
    assert refused.exit_code == 3, refused
    assert flood.truncated and flood.ok


def test_a_sigkilled_owners_containers_are_removed(docker_url: str) -> None:
    from test_runtime_reaping import leftovers, run_next_owner, start_owner, wait_until_clean

    docker = {
        "url": docker_url,
        "image": IMAGE,
        "volumes": {"/usr": "/usr", PYTHON_ROOT: PYTHON_ROOT},
    }
    root = tempfile.mkdtemp(prefix="vfray-test-reap-")
    try:
        # By the watchdog.
        owner, held = start_owner(root, ["docker"], docker)
        assert leftovers(held, docker_url), "the owner holds no container"
        owner.send_signal(signal.SIGKILL)
        owner.wait()
        assert wait_until_clean(held, docker_url) == []
        # By the next owner's first docker box, when the watchdog died with the owner.
        owner, held = start_owner(root, ["docker"], docker)
        os.kill(int(held["watchdog"]), signal.SIGKILL)  # type: ignore[call-overload]
        owner.send_signal(signal.SIGKILL)
        owner.wait()
        time.sleep(0.5)
        assert leftovers(held, docker_url), "nothing leaked: the test shows nothing"
        run_next_owner(root, ["docker"], docker)
        assert leftovers(held, docker_url) == []
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("harness_id", "registry"),
    [("codex", "npm"), ("claude-code", "npm"), ("mini-swe-agent", "pypi")],
)
async def test_an_agent_harness_rollout_in_docker(
    docker_url: str, harness_id: str, registry: str
) -> None:
    """The node's tool dir is mounted read-only into the container; the agent reaches the
    interception through the bridge of a network-less container and writes the file."""
    from agent_tools import need_registry
    from test_agents import PROMPT, WriteFile, _check_solved, _timed_install

    import vfray as vf

    need_registry(registry)
    _timed_install(harness_id)
    trace = await vf.run_rollout(
        WriteFile(vf.TaskData(prompt=PROMPT)),
        model="scripted:agent",
        harness=harness_id,
        runtime="docker",
        runtime_options={
            "base_url": docker_url,
            "default_image": IMAGE,
            "volumes": {"/usr": "/usr", PYTHON_ROOT: PYTHON_ROOT},
        },
    )
    _check_solved(trace, calls=3)
