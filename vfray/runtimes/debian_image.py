"""A small Debian base image built with no registry: ``mmdebstrap --variant=minbase`` from the
machine's own apt sources into a root filesystem tarball, then ``umoci`` into an OCI layout
(for ``oci:`` references and unpacked roots) and ``docker import`` into an engine (for
Dockerfiles that start ``FROM`` it). Built once per machine and package list into a cache dir.

``python -m vfray.runtimes.debian_image [--cache DIR] [--docker URL]`` builds it and prints
where it is; a cluster with no registry access runs it on each node (or copies the layout).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from vfray.runtimes._image_flight import file_lock, scratch_dir

SUITE = "bookworm"
PACKAGES = ("python3", "git")
DOCKER_NAME = f"vfray-base:{SUITE}"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TOOLS = ("mmdebstrap", "umoci")


class DebianImage(BaseModel):
    """A built base image: its root filesystem tarball and its OCI layout (tagged ``tag``)."""

    model_config = ConfigDict(frozen=True)

    tarball: Path
    layout: Path
    tag: str = SUITE

    @property
    def oci(self) -> str:
        """Its image reference, ``oci:LAYOUT:TAG``."""
        return f"oci:{self.layout}:{self.tag}"


def missing_tools() -> list[str]:
    """The programs a build needs that this machine lacks."""
    return [tool for tool in TOOLS if shutil.which(tool) is None]


def image_dir(cache: Path, suite: str = SUITE, packages: Sequence[str] = PACKAGES) -> Path:
    """Where the image of ``suite`` with ``packages`` is kept: a name keyed by both."""
    key = hashlib.sha256(f"{suite}\0{' '.join(sorted(packages))}".encode()).hexdigest()[:16]
    return cache / f"debian-{suite}-{key}"


def build(cache: Path, suite: str = SUITE, packages: Sequence[str] = PACKAGES) -> DebianImage:
    """The base image in ``cache``, built on first use (several processes asking at once
    build it once). Raises :class:`RuntimeError` with the failing tool's message."""
    missing = missing_tools()
    if missing:
        raise RuntimeError(f"cannot build the base image: {', '.join(missing)} not installed")
    dest = image_dir(cache, suite, packages)
    image = DebianImage(tarball=dest / "rootfs.tar", layout=dest / "oci", tag=suite)
    if dest.is_dir():
        return image
    for sub in ("locks", "tmp"):
        (cache / sub).mkdir(parents=True, exist_ok=True)
    with file_lock(cache / "locks" / dest.name):
        if dest.is_dir():
            return image
        work = scratch_dir(cache)
        try:
            tarball, layout = work / "rootfs.tar", work / "oci"
            include = ",".join(packages)
            _run(["mmdebstrap", "--quiet", "--variant=minbase", f"--include={include}", suite,
                  str(tarball)])  # fmt: skip
            image_ref = f"{layout}:{suite}"
            _run(["umoci", "init", "--layout", str(layout)])
            _run(["umoci", "new", "--image", image_ref])
            _run(["umoci", "raw", "add-layer", "--image", image_ref, str(tarball)])
            _run(["umoci", "config", "--image", image_ref, f"--config.env=PATH={PATH}",
                  "--config.workingdir=/", "--config.cmd=/bin/sh"])  # fmt: skip
            _run(["umoci", "gc", "--layout", str(layout)])
            os.rename(work, dest)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return image


def import_into_docker(image: DebianImage, docker_url: str, name: str = DOCKER_NAME) -> str:
    """``docker import`` the base image's root into the engine at ``docker_url`` as ``name``
    (unless it has it already); returns ``name``."""
    docker = ["docker", "-H", docker_url]
    if subprocess.run([*docker, "image", "inspect", name], capture_output=True).returncode:
        _run([*docker, "import", "-c", f"ENV PATH={PATH}", str(image.tarball), name])
    return name


def _run(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode:
        why = " ".join((done.stderr or done.stdout).split())[-800:]
        raise RuntimeError(f"{argv[0]} {argv[1]} failed: {why}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vfray.runtimes.debian_image")
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "vfray" / "base")
    parser.add_argument("--docker", metavar="URL", help="also docker import it into this engine")
    parser.add_argument("--suite", default=SUITE)
    parser.add_argument("--include", default=",".join(PACKAGES), help="packages, comma-separated")
    args = parser.parse_args(argv)
    try:
        image = build(args.cache, args.suite, tuple(filter(None, args.include.split(","))))
        print(image.oci)
        if args.docker:
            print(import_into_docker(image, args.docker, f"vfray-base:{args.suite}"))
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
