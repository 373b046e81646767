"""Internal: a box's copy-on-write root over a shared, read-only image root filesystem.

Three ways to give each box a private, throw-away layer over one unpacked image: a kernel
overlayfs mount (root only; one ``mount(2)``), ``fuse-overlayfs`` (rootless nodes; a daemon per
box) and a plain copy (anywhere; a full copy per box). ``auto`` takes the first that works here.
Measured by ``benchmarks/bwrap_image.py`` on a 223 MB Debian minbase root (2 cores, shared with
other work), box start to first command p50 against a plain bwrap box's 21 ms: kernel 27 ms
(1.3x; 112 kB of disk per box), fuse-overlayfs 48 ms (2.3x; its daemon's CPU besides), copy
3.1 s (146x; 224 MB and 2.7 s of CPU per box). The layer's dirs live in the box's
work dir, whose name carries the owner token: after an owner crash the lifeline's reaper
unmounts whatever is mounted under it before removing it (:func:`._reap.unmount_under`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import shutil
import subprocess
from pathlib import Path
from typing import Literal

from vfray.errors import SandboxError
from vfray.runtimes._reap import unmount_under

Backend = Literal["kernel", "fuse", "copy"]
BACKENDS: tuple[Backend, ...] = ("kernel", "fuse", "copy")


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def _fuse_overlayfs() -> str | None:
    return shutil.which("fuse-overlayfs")


def available(backend: Backend) -> bool:
    """Whether ``backend`` can be tried on this node (kernel: root; fuse: the program and
    ``/dev/fuse``; copy: always)."""
    if backend == "kernel":
        return os.geteuid() == 0
    if backend == "fuse":
        return _fuse_overlayfs() is not None and os.path.exists("/dev/fuse")
    return True


@functools.cache
def auto_backend(probe_dir: str) -> Backend:
    """The first backend that mounts a test layer in ``probe_dir`` (once per process and dir):
    kernel overlayfs as root, else fuse-overlayfs, else a copy."""
    for backend in BACKENDS[:2]:
        if not available(backend):
            continue
        probe = Path(probe_dir) / f".vfray-overlay-probe-{os.getpid()}"
        try:
            (probe / "lower").mkdir(parents=True, exist_ok=True)
            layer = CowRoot(str(probe / "lower"), probe / "box", backend)
            layer.mount()
            layer.unmount()
            return backend
        except SandboxError:
            continue
        finally:
            unmount_under(str(probe))
            shutil.rmtree(probe, ignore_errors=True)
    return "copy"


class CowRoot:
    """One box's root: ``lower`` (shared, never written) seen through ``dir/root``, with the
    box's writes kept in ``dir/upper`` until :meth:`unmount` throws them away."""

    def __init__(self, lower: str, directory: Path, backend: Backend) -> None:
        self.lower = lower
        self.dir = directory
        self.backend = backend
        self.root = directory / "root"
        self.mounted = False

    def mount(self) -> Path:
        """Make ``root``; SandboxError (one line) when the backend fails."""
        upper, work = self.dir / "upper", self.dir / "ovwork"
        for d in (self.root, upper, work):
            d.mkdir(parents=True, exist_ok=True)
        # Options are comma-separated: a path with a comma (or colon: lowerdir stacks) cannot
        # be named to overlayfs.
        if any(c in str(p) for p in (self.lower, self.dir) for c in ",:"):
            raise SandboxError(f"cannot overlay {self.lower}: a path holds ',' or ':'")
        options = f"lowerdir={self.lower},upperdir={upper},workdir={work}"
        if self.backend == "kernel":
            done = _libc().mount(
                b"overlay", str(self.root).encode(), b"overlay", 0, options.encode()
            )
            if done != 0:
                err = ctypes.get_errno()
                raise SandboxError(f"kernel overlay mount over {self.lower}: {os.strerror(err)}")
        elif self.backend == "fuse":
            fuse = _fuse_overlayfs()
            if fuse is None:
                raise SandboxError("fuse-overlayfs is not installed (apt-get install it)")
            try:
                subprocess.run(
                    [fuse, "-o", options, str(self.root)],
                    check=True,
                    capture_output=True,
                    text=True,
                    timeout=60,
                    env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                )
            except subprocess.CalledProcessError as exc:
                why = (exc.stderr.strip().splitlines() or [f"exit code {exc.returncode}"])[-1]
                raise SandboxError(f"fuse-overlayfs over {self.lower}: {why}") from exc
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise SandboxError(f"fuse-overlayfs over {self.lower}: {exc}") from exc
        else:
            self.root.rmdir()
            try:
                subprocess.run(
                    ["cp", "-a", "--reflink=auto", self.lower, str(self.root)],
                    check=True,
                    capture_output=True,
                    text=True,
                    timeout=600,
                )
            except (OSError, subprocess.SubprocessError) as exc:
                raise SandboxError(f"cannot copy {self.lower}: {exc}") from exc
        self.mounted = self.backend != "copy"
        return self.root

    def unmount(self) -> None:
        """Detach the root (lazily: a box still dying keeps its view until it is gone).
        Idempotent; the dirs themselves go with the box's work dir."""
        if self.mounted:
            self.mounted = False
            unmount_under(str(self.dir))
