"""The node's image store: what the first rollout that asks for an image pays against every later
one, for a Docker engine (a Dockerfile built FROM the offline base image) and for an unpacked
root (the base image's OCI layout), as ratios of one run; then the Dockerfile image's first
unpack into a root both ways, alternated: untarred from the engine's archive (as root) against
``skopeo copy`` to a layout and ``umoci unpack`` (the way before, kept for other users).

Run as root: ``python benchmarks/image_store.py [--repeat 200] [--rounds 3]``. It builds (or
finds) the base image in /var/cache/vfray-ci/images, starts the tests' private dockerd
(tests/docker_engine.py) and uses a fresh store in a temporary dir. "cached" is the in-process
memo for docker (a content key, then a dict) and the directory check for rootfs (a content key,
then a stat); "cached in another process" drops docker's memo, so the flock and the engine's
``image inspect`` answer, as they do for a second SandboxHost on the node.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import os
import resource
import statistics
import subprocess
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


async def main(repeat: int, rounds: int) -> None:
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
        _report("rootfs (the base layout unpacked)", first, same)
        _compare_unpacks(ref, name, make, Path(tmp), rounds)


def _cpu_meter() -> Callable[[], float]:
    """CPU seconds of this process and everything it starts, from a cgroup v1 ``cpuacct`` group
    it joins (the tools' children inherit it: bwrap's tar is never reaped into this process's
    children's times, being a child of the box's init); the reaped children's times where no
    such group can be made."""
    group = Path(f"/sys/fs/cgroup/cpuacct/vfray-bench-{os.getpid()}")
    try:
        group.mkdir(exist_ok=True)
        (group / "cgroup.procs").write_text(str(os.getpid()))

        @atexit.register
        def leave() -> None:
            with contextlib.suppress(OSError):
                (group.parent / "cgroup.procs").write_text(str(os.getpid()))
                group.rmdir()

        return lambda: int((group / "cpuacct.usage").read_text()) / 1e9
    except OSError:

        def reaped() -> float:
            own = resource.getrusage(resource.RUSAGE_SELF)
            children = resource.getrusage(resource.RUSAGE_CHILDREN)
            return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime

        return reaped


def _compare_unpacks(ref: Any, name: str, make: Callable[[], Any], tmp: Path, rounds: int) -> None:
    """The Dockerfile image (built, in the engine) unpacked into a root, alternately: the
    engine's archive untarred in place (as root) and copied by skopeo to a layout that umoci
    unpacks (the way before, kept for other users). CPU here and in the tools; the engine's own
    ``docker save`` is not counted, on either side."""
    from vfray.runtimes import _image_rootfs as store

    ways = {"tar": store.untar_image, "skopeo + umoci": store.umoci_image}
    source = store.ImageSource(ref, name, make)
    cpu_s = _cpu_meter()
    cpu: dict[str, list[float]] = {way: [] for way in ways}
    wall: dict[str, list[float]] = {way: [] for way in ways}
    for round_ in range(rounds):
        for way, unpack in ways.items():
            work = tmp / f"cmp-{round_}-{way.split()[0]}"
            work.mkdir()
            cpu_before, started = cpu_s(), time.perf_counter()
            unpack(source, work, work / "bundle")
            wall[way].append(time.perf_counter() - started)
            cpu[way].append(cpu_s() - cpu_before)
            subprocess.run(["rm", "-rf", str(work)], check=True)
    tar, umoci = (statistics.median(cpu[w]) for w in ways)
    for way in ways:
        cpu_p50, wall_p50 = statistics.median(cpu[way]), statistics.median(wall[way])
        print(
            f"first unpack of the Dockerfile image, {way}: CPU p50 {cpu_p50:.2f} s, "
            f"wall p50 {wall_p50:.2f} s ({rounds} rounds)"
        )
    print(f"  skopeo + umoci / tar CPU: {umoci / tar:.1f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3, help="unpacks of each way, alternated")
    args = parser.parse_args()
    asyncio.run(main(args.repeat, args.rounds))
