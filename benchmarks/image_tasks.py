"""Tasks in their own images on bwrap (issue 28), as ratios of one run:

1. box start to first command (``prepare_image`` + ``start`` + ``run(["/bin/true"])``, the
   node's store already holding the image) for a bwrap box on the offline Debian base image,
   against a plain bwrap box over the host's root, against ``docker run --rm`` of the same image
   in the tests' private dockerd, and against vfray's docker runtime on that image;
2. 64 image boxes at once (start, a shell command and the node's Python, stop): errors and wall;
3. a 50-task taskset over 5 distinct Dockerfile images (FROM the base image) run twice, each run
   a fresh process (``vfray eval`` would be one): what the second run builds, exports or unpacks,
   counted from the engine's events (a ``RUN`` step creates a container; an export is an image
   ``save``) and the store's unpacked roots (new ones, or ones whose mtime changed).

Run as root: ``python benchmarks/image_tasks.py [--boxes 30] [--parts 123]`` (``--parts 1``:
the first measurement only). It builds (or finds) the base image in /var/cache/vfray-ci/images,
starts the tests' dockerd (tests/docker_engine.py) and uses a fresh image store in a temporary dir.
Figures of one run: docs/guides/performance.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from vfray.runtimes import debian_image  # noqa: E402
from vfray.runtimes.base import Runtime, RuntimeSpec  # noqa: E402
from vfray.runtimes.bwrap import BwrapRuntime  # noqa: E402
from vfray.runtimes.images import CACHE_ENV  # noqa: E402

IMAGES = 5
TASKS = 50


async def _first_command_ms(make: Callable[[], Runtime], boxes: int) -> list[float]:
    times = []
    for _ in range(boxes):
        rt = make()
        started = time.perf_counter()
        try:
            await rt.prepare_image()
            await rt.start()
            done = await rt.run(["/bin/true"], timeout=120)
            times.append((time.perf_counter() - started) * 1000)
            if not done.ok:
                raise RuntimeError(f"/bin/true failed: {done}")
        finally:
            await rt.stop()
    return times


def _docker_run_ms(url: str, image: str, boxes: int) -> list[float]:
    times = []
    for _ in range(boxes):
        started = time.perf_counter()
        subprocess.run(
            ["docker", "-H", url, "run", "--rm", "--network", "none", image, "/bin/true"],
            check=True,
            capture_output=True,
        )
        times.append((time.perf_counter() - started) * 1000)
    return times


async def _concurrent(image: str, n: int) -> tuple[int, float]:
    async def one(i: int) -> str:
        rt = BwrapRuntime(RuntimeSpec(image=image, workdir="/testbed"))
        try:
            await rt.start()
            shell = await rt.run(["/bin/sh", "-c", f"echo {i} > n; cat n"], timeout=300)
            node = await rt.run([rt.python, "-I", "-S", "-c", "print(open('n').read())"])
            ok = shell.stdout.strip() == str(i) == node.stdout.strip()
            return "" if ok else f"box {i}: {shell} {node}"
        except Exception as exc:
            return f"box {i}: {type(exc).__name__}: {exc}"
        finally:
            await rt.stop()

    started = time.perf_counter()
    errors = [e for e in await asyncio.gather(*(one(i) for i in range(n))) if e]
    for error in errors[:3]:
        print("  ", error[:300])
    return len(errors), time.perf_counter() - started


TASKSET_RUN = """
import asyncio, json, sys, time
import vfray as vf
from vfray.run.environment import LocalEnvironment

class Which(vf.TaskData):
    which: str

class Built(vf.Task[Which]):
    @vf.reward
    async def built(self, runtime):
        which = (await runtime.read("/etc/which")).strip().decode()
        return float(which == self.data.which)

async def main(url, contexts):
    tasks = [Built(Which(prompt="hi", image=f"dockerfile:{contexts[i % len(contexts)]}",
                         which=str(i % len(contexts))), f"t{i}")
             for i in range(int(sys.argv[3]))]
    started = time.perf_counter()
    async with LocalEnvironment(model="scripted:echo", harness="null", runtime="bwrap",
                                runtime_options={"docker_url": url}) as env:
        traces = await asyncio.gather(*(env.rollout(t) for t in tasks))
    image = sorted(t.timing["image"].duration or 0 for t in traces)
    print(json.dumps({"wall_s": time.perf_counter() - started,
                      "ok": sum(t.reward == 1.0 for t in traces),
                      "image_phase_p50_ms": 1000 * image[len(image) // 2],
                      "image_phase_max_ms": 1000 * image[-1]}))

asyncio.run(main(sys.argv[1], json.loads(sys.argv[2])))
"""


def _taskset_run(url: str, contexts: list[str]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", TASKSET_RUN, url, json.dumps(contexts), str(TASKS)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=False,
    )
    if done.returncode:
        raise RuntimeError(done.stderr[-2000:])
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _roots(store: Path) -> dict[str, int]:
    found = store / "rootfs"
    return {p.name: p.stat().st_mtime_ns for p in found.iterdir()} if found.is_dir() else {}


def _engine_work(client: Any, since: float, until: float) -> dict[str, int]:
    counts = {"builder containers": 0, "image saves": 0, "images built or tagged": 0}
    for event in client.events(since=int(since), until=int(until) + 1, decode=True):
        kind, action = event.get("Type"), str(event.get("Action", ""))
        if kind == "container" and action == "create":
            counts["builder containers"] += 1
        elif kind == "image" and action == "save":
            counts["image saves"] += 1
        elif kind == "image" and action in ("tag", "build", "import", "load", "pull"):
            counts["images built or tagged"] += 1
    return counts


def _p50(xs: list[float]) -> float:
    return statistics.median(xs)


async def main(boxes: int, parts: str) -> None:
    import docker
    from docker_engine import docker_engine

    base = debian_image.build(Path("/var/cache/vfray-ci/images"))
    with tempfile.TemporaryDirectory() as tmp, docker_engine() as url:
        store = Path(tmp) / "store"
        os.environ[CACHE_ENV] = str(store)
        in_engine = debian_image.import_into_docker(base, url)
        client = docker.DockerClient(base_url=url)

        if "1" in parts:
            await _start_to_first_command(base, in_engine, url, boxes)
        if "2" in parts:
            print("2. 64 image boxes at once")
            errors, wall = await _concurrent(base.oci, 64)
            print(f"   errors {errors}, wall {wall:.1f} s")
        if "3" in parts:
            await _second_run(base, in_engine, url, client, store, Path(tmp))
        client.close()


async def _start_to_first_command(base: Any, in_engine: str, url: str, boxes: int) -> None:
    print("1. box start to first command (store warm), p50 over", boxes, "boxes")
    await _first_command_ms(lambda: BwrapRuntime(RuntimeSpec(image=base.oci)), 1)  # unpack
    _docker_run_ms(url, in_engine, 2)  # warm the engine
    from vfray.runtimes.docker import DockerRuntime

    # Interleaved, one box of each kind per round: the shared machine's load drifts.
    times: dict[str, list[float]] = {"plain": [], "image": [], "run": [], "vfray": []}
    for _ in range(boxes):
        times["plain"] += await _first_command_ms(lambda: BwrapRuntime(RuntimeSpec()), 1)
        times["image"] += await _first_command_ms(
            lambda: BwrapRuntime(RuntimeSpec(image=base.oci)), 1
        )
        times["run"] += _docker_run_ms(url, in_engine, 1)
        times["vfray"] += await _first_command_ms(
            lambda: DockerRuntime(RuntimeSpec(image=in_engine), base_url=url), 1
        )
    plain, image, docker_run, vfray_docker = (_p50(times[k]) for k in times)
    rows = [
        ("plain bwrap box", plain, ""),
        ("bwrap on the image", image, f"{image / plain:.2f}x plain bwrap"),
        ("docker run --rm", docker_run, f"{docker_run / image:.1f}x bwrap-on-image"),
        ("vfray docker runtime", vfray_docker, f"{vfray_docker / image:.1f}x bwrap-on-image"),
    ]
    for name, ms, ratio in rows:
        print(f"   {name:22} {ms:8.1f} ms  {ratio}")


async def _second_run(
    base: Any, in_engine: str, url: str, client: Any, store: Path, tmp: Path
) -> None:
    print(f"3. {TASKS} tasks over {IMAGES} Dockerfile images, two runs (fresh processes)")
    contexts = []
    for i in range(IMAGES):
        context = tmp / f"ctx{i}"
        context.mkdir()
        (context / "Dockerfile").write_text(f"FROM {in_engine}\nRUN echo {i} > /etc/which\n")
        contexts.append(str(context))
    for run in ("first", "second"):
        roots_before = _roots(store)
        since = time.time()
        result = _taskset_run(url, contexts)
        work = _engine_work(client, since, time.time())
        roots_after = _roots(store)
        unpacked = sum(roots_before.get(k) != v for k, v in roots_after.items())
        print(
            f"   {run} run: {result['ok']}/{TASKS} ok in {result['wall_s']:.1f} s; image phase "
            f"p50 {result['image_phase_p50_ms']:.1f} ms, max {result['image_phase_max_ms']:.0f}"
            f" ms; engine: {work}; roots unpacked: {unpacked} (store holds {len(roots_after)})"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--boxes", type=int, default=30)
    parser.add_argument("--parts", default="123", help="which of the 3 measurements to run")
    args = parser.parse_args()
    asyncio.run(main(args.boxes, args.parts))
