"""A driver SIGKILLed on the real Ray backend with rollouts in docker boxes leaves no container
on the engine and no box work dir: the driver's watchdog kills the SandboxHost, and the host's
own watchdog (spared: it carries ``VFRAY_WATCHDOG_OF``) removes the host's containers.

tests/test_chaos.py checks dirs and cgroups after a driver kill with bwrap boxes; this is its
docker half, on the tests' own ``dockerd`` (tests/docker_engine.py)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from chaos_checks import box_dirs, gone, marked, watchdogs
from docker_engine import runtime_options
from test_chaos import descendants, env_for, temp, vfray_cli, wait_for

from vfray.runtimes import _reap

__all__ = ["temp"]  # the fixture, shared with tests/test_chaos.py

pytestmark = [pytest.mark.slow, pytest.mark.docker]

BOXES = 3


def containers(url: str) -> dict[str, str]:
    """Every vfray container on the engine, running or not: id -> state."""
    listed = _reap._containers(url, _reap.OWNER_LABEL)
    return {str(c["Id"])[:12]: str(c.get("State")) for c in listed}


def test_a_killed_drivers_docker_containers_and_box_dirs_go(
    docker_url: str, tmp_path: Path, temp: Path
) -> None:
    before = set(containers(docker_url))  # the session's engine: other tests' leftovers
    log_path = tmp_path / "driver.log"
    # Each rollout starts its box, then waits on a model that answers in 10 minutes: the
    # containers live until the driver is killed.
    command = [
        *vfray_cli(),
        "eval",
        "arithmetic",
        "-n",
        str(BOXES),
        "-r",
        "1",
        "-c",
        str(BOXES),
        "--harness",
        "null",
        "-m",
        "scripted:echo?latency=600",
        "--runtime",
        "docker",
        "--env.runtime.options",
        json.dumps(runtime_options(docker_url)),
        "-o",
        str(tmp_path / "out"),
        "--no-progress",
    ]
    with log_path.open("w") as log_file:
        driver = subprocess.Popen(
            command, env=env_for(temp), stdout=log_file, stderr=subprocess.STDOUT
        )

    def ours() -> dict[str, str]:
        return {k: v for k, v in containers(docker_url).items() if k not in before}

    def running() -> dict[str, str]:
        assert driver.poll() is None, log_path.read_text(errors="replace")[-3000:]
        live = {k: v for k, v in ours().items() if v == "running"}
        return live if len(live) == BOXES else {}

    try:
        live = wait_for(running, 120, f"{BOXES} running containers")
        dirs = box_dirs(temp)
        hosts = [p for p, cmd in descendants(driver.pid).items() if "SandboxHost" in cmd]
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(timeout=60)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    # The fault hit: the driver is dead with its boxes up and their dirs on disk.
    assert gone(driver.pid)
    assert hosts, "no SandboxHost process was found under the driver"
    assert any(d.startswith("vfray-docker-") for d in dirs), dirs

    def leftovers() -> list[str]:
        return (
            [f"container {k} ({v})" for k, v in ours().items()]
            + [f"dir {d}" for d in sorted(box_dirs(temp))]
            + [f"process {p}" for p in marked(temp)]  # the run's Ray, hosts, boxes' programs
        )

    killed = time.monotonic()
    with contextlib.suppress(AssertionError):
        wait_for(lambda: not leftovers(), 60, "what the dead driver left to go")
    left = leftovers()
    assert not left, (
        f"outlived their SIGKILLed driver (running at the kill: {sorted(live)}): {left}; "
        f"live watchdogs by owner: {watchdogs()}; "
        f"the driver's log ends: {log_path.read_text(errors='replace')[-2000:]}"
    )
    print(
        f"driver kill: {len(live)} running containers, {len(dirs)} box dirs, "
        f"{len(hosts)} hosts; all gone {time.monotonic() - killed:.1f} s after the kill"
    )
