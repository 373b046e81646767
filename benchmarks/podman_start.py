"""The podman runtime against the docker runtime on the same image (the offline Debian base, from
its OCI layout for podman, ``docker import``-ed for docker): box start to the first command's
answer, one ``run`` in a started box, and stop, as p50s and ratios of one run. The image is made
present in each store before timing, so the figures are the per-rollout cost, not the first load.

Run as root: ``python benchmarks/podman_start.py [--repeat 10]``. It builds (or finds) the base
image in /var/cache/vfray-ci/images and starts the tests' private dockerd (tests/docker_engine.py).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from vfray.runtimes import debian_image  # noqa: E402
from vfray.runtimes.base import Runtime, RuntimeSpec  # noqa: E402
from vfray.runtimes.docker import DockerRuntime  # noqa: E402
from vfray.runtimes.podman import PodmanRuntime  # noqa: E402


async def measure(make: Callable[[], Runtime], repeat: int) -> dict[str, float]:
    first, runs, stops = [], [], []
    for _ in range(repeat):
        rt = make()
        started = time.perf_counter()
        await rt.start()
        done = await rt.run(["true"], timeout=60)
        first.append(time.perf_counter() - started)
        assert done.ok, done
        for _ in range(5):
            t = time.perf_counter()
            await rt.run(["true"], timeout=60)
            runs.append(time.perf_counter() - t)
        t = time.perf_counter()
        await rt.stop()
        stops.append(time.perf_counter() - t)
    return {
        "start to first command": statistics.median(first),
        "one run": statistics.median(runs),
        "stop": statistics.median(stops),
    }


async def main(repeat: int) -> None:
    from docker_engine import docker_engine

    base = debian_image.build(Path("/var/cache/vfray-ci/images"))
    with docker_engine() as url:
        name = debian_image.import_into_docker(base, url)
        spec = RuntimeSpec(workdir="/testbed")
        make_docker = lambda: DockerRuntime(spec, base_url=url, default_image=name)  # noqa: E731
        make_podman = lambda: PodmanRuntime(spec.model_copy(update={"image": base.oci}))  # noqa: E731
        await measure(make_podman, 1)  # the layout read into podman's store once
        await measure(make_docker, 1)
        podman = await measure(make_podman, repeat)
        docker = await measure(make_docker, repeat)
    for what in podman:
        print(
            f"{what}: podman p50 {podman[what] * 1000:.0f} ms, docker p50 "
            f"{docker[what] * 1000:.0f} ms ({podman[what] / docker[what]:.1f}x)"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=10)
    asyncio.run(main(parser.parse_args().repeat))
