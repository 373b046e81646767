"""bwrap boxes on an image root: box start to first command, per copy-on-write backend, against
a plain bwrap box over the host's root; with the CPU and the disk each box costs.

Run (as root for the kernel backend): ``python benchmarks/bwrap_image.py [--root DIR]
[--boxes 50] [--copy-boxes 10]``. ``--root`` defaults to the Debian minbase root the tests build
(``tests/test_bwrap_image.py``: /var/cache/vfray-ci/bookworm-minbase-python3.root). Each box is
started, runs ``/bin/true`` once (timed together: what a rollout waits for), then its layer's
size is taken (``du`` of the box dir) and it is stopped (timed apart). CPU is this process's and
its children's user+system time over all boxes of a backend, per box. Backends whose
prerequisites are missing are reported as skipped. Figures of one run are in the docstring of
``vfray/runtimes/_overlay.py``'s chooser and in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import subprocess
import time
from pathlib import Path

from vfray.runtimes._overlay import BACKENDS, available
from vfray.runtimes.base import RuntimeSpec
from vfray.runtimes.bwrap import BwrapRuntime

DEFAULT_ROOT = "/var/cache/vfray-ci/bookworm-minbase-python3.root"


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _du_kb(path: Path) -> int:
    done = subprocess.run(["du", "-sk", "-x", str(path)], capture_output=True, text=True)
    return int(done.stdout.split()[0]) if done.returncode == 0 else -1


async def measure(root: str | None, backend: str, boxes: int) -> dict[str, float]:
    first, stops, disk = [], [], []
    cpu = _cpu()
    for _ in range(boxes):
        spec = RuntimeSpec(rootfs=root, workdir="/testbed") if root else RuntimeSpec()
        rt = BwrapRuntime(spec, overlay=backend)  # type: ignore[arg-type]
        started = time.perf_counter()
        await rt.start()
        done = await rt.run(["/bin/true"], timeout=120)
        first.append((time.perf_counter() - started) * 1000)
        if not done.ok:
            raise RuntimeError(f"/bin/true failed in a {backend} box: {done}")
        assert rt.base is not None
        # The box's own bytes: its layer (the mount itself not crossed: -x).
        disk.append(_du_kb(rt.base))
        started = time.perf_counter()
        await rt.stop()
        stops.append((time.perf_counter() - started) * 1000)
    ordered = sorted(first)
    return {
        "p50_ms": statistics.median(first),
        "p90_ms": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))],
        "stop_p50_ms": statistics.median(stops),
        "cpu_ms_per_box": (_cpu() - cpu) * 1000 / boxes,
        "disk_kb_per_box": statistics.median(disk),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=DEFAULT_ROOT)
    parser.add_argument("--boxes", type=int, default=50)
    parser.add_argument("--copy-boxes", type=int, default=10, help="a copy costs the whole root")
    args = parser.parse_args()
    if not os.path.isdir(args.root):
        raise SystemExit(f"no root at {args.root}: run tests/test_bwrap_image.py once, or --root")
    results: dict[str, dict[str, float]] = {}
    results["plain bwrap (host root)"] = await measure(None, "auto", args.boxes)
    for backend in BACKENDS:
        if not available(backend):
            print(f"{backend}: skipped (not available here)")
            continue
        n = args.copy_boxes if backend == "copy" else args.boxes
        results[f"image, {backend}"] = await measure(args.root, backend, n)
    base = results["plain bwrap (host root)"]["p50_ms"]
    print(f"root: {args.root} ({_du_kb(Path(args.root)) // 1024} MB)")
    print(f"{'box':28} {'start->1st p50':>15} {'p90':>8} {'ratio':>6} {'stop p50':>9} "
          f"{'CPU/box':>9} {'disk/box':>10}")  # fmt: skip
    for name, r in results.items():
        print(
            f"{name:28} {r['p50_ms']:>12.1f} ms {r['p90_ms']:>5.1f} ms {r['p50_ms'] / base:>5.2f}x "
            f"{r['stop_p50_ms']:>6.1f} ms {r['cpu_ms_per_box']:>6.1f} ms "
            f"{r['disk_kb_per_box']:>7.0f} kB"
        )


if __name__ == "__main__":
    asyncio.run(main())
