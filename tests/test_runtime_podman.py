"""The podman runtime on real podman (skipped with the reason where podman cannot run a
container here), boxes in the offline Debian base image read from its OCI layout: the runtime
contract, a scored bash rollout through the interception, egress refused in the agent phase,
and a SIGKILLed owner's container reaped."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import pytest
from test_egress import PORT, Far, far, interception  # noqa: F401 - far is a fixture

import vfray as vf
from vfray.runtimes import _reap
from vfray.runtimes.base import Runtime, RuntimeSpec
from vfray.runtimes.podman import PodmanRuntime
from vfray.testing.conformance import check_runtime


@pytest.fixture(scope="module")
def podman_ref(debian_image: object) -> str:
    """The base image's ``oci:`` reference, where podman can run a container here."""
    from vfray.runtimes import debian_image as base

    assert isinstance(debian_image, base.DebianImage)
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed (apt-get install podman)")
    try:
        PodmanRuntime.preflight({})
    except vf.ConfigError as exc:
        pytest.skip(str(exc))
    return debian_image.oci


def podman_box(ref: str) -> Callable[..., Runtime]:
    def make(spec: RuntimeSpec | None = None, **options: object) -> Runtime:
        spec = (spec or RuntimeSpec()).model_copy(update={"image": ref})
        return PodmanRuntime(spec, **options)  # type: ignore[arg-type]

    return make


async def test_podman_conformance(podman_ref: str) -> None:
    await check_runtime(lambda: podman_box(podman_ref)(RuntimeSpec(memory_gb=0.5, cpu=1.0)))


async def test_files_of_any_size_go_in_and_out(podman_ref: str) -> None:
    # podman 4.3's `cp -` failed ("io: read/write on closed pipe") on a tar padded to a whole
    # record after 30,000-31,000 bytes of file: the chat loop program is that size.
    async with podman_box(podman_ref)() as rt:
        for size in (0, 12_000, 25_474, 30_000, 30_938, 31_000, 35_000, 70_000):
            data = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
            await rt.write(f"f{size}", data)
            assert await rt.read(f"f{size}") == data


async def test_the_box_is_locked_down_and_limited(podman_ref: str) -> None:
    spec = RuntimeSpec(memory_gb=0.25, pids=64, workdir="/testbed")
    async with podman_box(podman_ref)(spec) as rt:
        seen = await rt.run(["sh", "-c", "pwd; grep CapEff /proc/self/status; "
                             "grep NoNewPrivs /proc/self/status; "
                             "cat /sys/fs/cgroup/pids/pids.max "
                             "/sys/fs/cgroup/memory/memory.limit_in_bytes; "
                             "cat /sys/class/net/*/operstate 2>/dev/null | wc -l"])  # fmt: skip
        assert seen.ok, seen
        lines = seen.stdout.split()
    assert lines[0] == "/testbed"
    assert "0000000000000000" in seen.stdout and "NoNewPrivs:\t1" in seen.stdout
    assert "64" in lines and str(256 * 1024 * 1024) in lines
    assert lines[-1] == "1"  # network none: the loopback only


MULTIPLY = (
    "a, b = open('fixture.txt').read().split(); open('product', 'w').write(str(int(a) * int(b)))"
)


class Multiply(vf.Task[vf.TaskData]):
    """Setup writes a file in the work dir; the reward runs a command on it in the box."""

    async def setup(self, trace: vf.Trace, runtime: Runtime) -> None:
        await runtime.write("fixture.txt", b"6 9")

    @vf.reward
    async def right(self, trace: vf.Trace, runtime: Runtime) -> bool:
        done = await runtime.run(["python3", "-I", "-S", "-c", MULTIPLY], timeout=60)
        where = await runtime.run(["sh", "-c", "pwd; . /etc/os-release; echo $ID"], timeout=60)
        assert done.ok, done.stderr
        assert where.stdout.split() == ["/testbed", "debian"], where
        assert await runtime.read("/testbed/product") == b"54"
        return "54" in (trace.last_reply or "")


async def test_a_bash_rollout_scores_through_the_interception(podman_ref: str) -> None:
    task = Multiply(
        vf.TaskData(
            prompt="Run `echo $((6 * 9))` and report what it prints.",
            image=podman_ref,
            workdir="/testbed",
        )
    )
    trace = await vf.run_rollout(task, model="scripted:bash", harness="bash", runtime="podman")
    assert trace.ok, trace.errors
    assert trace.reward == 1.0


FETCH = """
import sys, urllib.request
try:
    print(urllib.request.urlopen(sys.argv[1], timeout=20).read().decode(), end="")
except Exception as exc:
    print("ERR", exc)
"""


async def fetch(rt: Runtime, url: str) -> str:
    done = await rt.run(["python3", "-c", FETCH, url], timeout=60)
    return done.stdout + done.stderr


async def test_the_agent_phase_reaches_only_its_allowed_host(
    far: Far,  # noqa: F811 - the fixture
    podman_ref: str,
) -> None:
    box = podman_box(podman_ref)(RuntimeSpec(network_allow=(far.allowed,)))
    async with interception() as host_url, box as rt:
        url = await rt.host_url(host_url)
        assert await fetch(rt, far.url(far.other)) == "hello from far\n"  # setup: any host
        await rt.prepare_execution([url])
        assert await fetch(rt, far.url(far.allowed)) == "hello from far\n"
        said = await fetch(rt, far.url(far.other))
        assert f"{far.other}:{PORT} is not in network_allow" in said or "403" in said, said
        assert await fetch(rt, f"{url}/v1") == "interception here"


OWNER = """
import asyncio, json, sys, time
from vfray.runtimes import lifeline
from vfray.runtimes.base import RuntimeSpec
from vfray.runtimes.podman import PodmanRuntime

async def main():
    rt = PodmanRuntime(RuntimeSpec(image=sys.argv[1]))
    await rt.start()
    life = lifeline._lifeline
    print(json.dumps({"token": rt.owner, "name": f"vfray-{rt.box_id}",
                      "watchdog": life.watchdog_pid}), flush=True)
    time.sleep(600)

asyncio.run(main())
"""


def _containers(token: str) -> list[str]:
    listed = subprocess.run(
        ["podman", "ps", "-a", "--filter", f"label={_reap.OWNER_LABEL}={token}", "--format",
         "json"], capture_output=True, text=True, check=True,
    )  # fmt: skip
    return [str(c["Id"]) for c in json.loads(listed.stdout or "[]")]


def _start_owner(ref: str) -> tuple[subprocess.Popen[str], dict[str, object]]:
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, ref], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    assert owner.stdout is not None and owner.stderr is not None
    line = owner.stdout.readline()
    if not line:
        owner.kill()
        raise AssertionError(f"the owner did not start its box: {owner.stderr.read()[-3000:]}")
    held: dict[str, object] = json.loads(line)
    return owner, held


def _gone(token: str) -> bool:
    deadline = time.monotonic() + 60
    while _containers(token) and time.monotonic() < deadline:
        time.sleep(0.2)
    return not _containers(token)


def test_a_sigkilled_owners_container_is_removed(podman_ref: str) -> None:
    # By the owner's watchdog.
    owner, held = _start_owner(podman_ref)
    token = str(held["token"])
    assert _containers(token), "the owner holds no container"
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    assert _gone(token)
    # By the next owner's first podman box, when the watchdog died with the owner.
    owner, held = _start_owner(podman_ref)
    token = str(held["token"])
    os.kill(int(str(held["watchdog"])), signal.SIGKILL)
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    time.sleep(0.5)
    assert _containers(token), "nothing leaked: the test shows nothing"
    nxt, _ = _start_owner(podman_ref)
    try:
        assert _gone(token)
    finally:
        nxt.terminate()
        nxt.wait()
