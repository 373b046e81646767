"""Docker runtime tests against a ``dockerd`` the tests start by hand (``docker_url``, see
tests/docker_engine.py; skipped without one)."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable

import pytest
from docker_engine import IMAGE, VOLUMES, runtime_options
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from vfray.endpoints.serving import serve_in_loop
from vfray.runtimes.base import Runtime, RuntimeSpec
from vfray.runtimes.docker import DockerRuntime
from vfray.testing.conformance import check_runtime

pytestmark = pytest.mark.docker


def docker_factory(url: str, **spec: object) -> Callable[[], Runtime]:
    return lambda: DockerRuntime(
        RuntimeSpec(image=IMAGE, **spec),
        base_url=url,
        volumes=dict(VOLUMES),
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
        "volumes": dict(VOLUMES),
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
        # Bounded wait, as for the local boxes: a killed container's processes and the
        # container itself took a moment to go on a loaded CI machine after the sweep.
        assert wait_until_clean(held, docker_url) == []
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
        runtime_options=runtime_options(docker_url),
    )
    _check_solved(trace, calls=3)
