"""The node's image store: what the first rollout that asks for an image pays against every later
one, for a Docker engine (a Dockerfile built FROM the offline base image) and for an unpacked
root (the base image's OCI layout through umoci), as ratios of one run.

Run as root: ``python benchmarks/image_store.py [--repeat 200]``. It builds (or finds) the base
image in /var/cache/vfray-ci/images, starts the tests' private dockerd (tests/docker_engine.py)
and uses a fresh store in a temporary dir. "cached" is the in-process memo for docker (a content
key, then a dict) and the directory check for rootfs (a content key, then a stat); "cached in
another process" drops docker's memo, so the flock and the engine's ``image inspect`` answer,
as they do for a second SandboxHost on the node.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from vfray.runtimes import debian_image  # noqa: E402
from vfray.runtimes.images import (  # noqa: E402
    CACHE_ENV,
    docker_image,
    forget_docker_image,
    parse_image,
    rootfs,
)


async def _p50_ms(
    call: Callable[[], Awaitable[Any]], repeat: int, before: Callable[[], None]
) -> float:
    times = []
    for _ in range(repeat):
        before()
        started = time.perf_counter()
        await call()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


async def _once_ms(call: Callable[[], Awaitable[Any]]) -> float:
    started = time.perf_counter()
    await call()
    return (time.perf_counter() - started) * 1000


def _report(what: str, first: float, same: float, other: float | None = None) -> None:
    line = f"{what}: first use {first:.0f} ms; cached p50 {same:.3f} ms ({first / same:.0f}x less)"
    if other is not None:
        line += f"; cached in another process p50 {other:.2f} ms ({first / other:.0f}x less)"
    print(line)


async def main(repeat: int) -> None:
    import docker
    from docker_engine import docker_engine

    base = debian_image.build(Path("/var/cache/vfray-ci/images"))
    with tempfile.TemporaryDirectory() as tmp, docker_engine() as url:
        os.environ[CACHE_ENV] = str(Path(tmp) / "store")
        debian_image.import_into_docker(base, url)
        context = Path(tmp) / "ctx"
        context.mkdir()
        (context / "Dockerfile").write_text(
            "FROM vfray-base:bookworm\nRUN mkdir /testbed && echo hi > /testbed/f\n"
        )
        ref = parse_image(f"dockerfile:{context}")

        def make() -> Any:
            return docker.DockerClient(base_url=url)

        async def ask() -> str:
            return await docker_image(ref, make, engine=url)

        first = await _once_ms(ask)
        name = await ask()
        same = await _p50_ms(ask, repeat, lambda: None)
        other = await _p50_ms(ask, max(10, repeat // 10), lambda: forget_docker_image(url, name))
        _report("docker (Dockerfile FROM the base image)", first, same, other)

        layout = parse_image(base.oci)

        async def unpack() -> Path:
            return await rootfs(layout)

        first = await _once_ms(unpack)
        same = await _p50_ms(unpack, repeat, lambda: None)
        # No memo to drop: every process finds the root by its directory.
        _report("rootfs (umoci unpack of the base layout)", first, same)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=200)
    asyncio.run(main(parser.parse_args().repeat))
