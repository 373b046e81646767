"""A Docker engine for the tests that need one: a ``dockerd`` started by hand in a temporary
root (no bridge, no iptables), with a test image imported from an almost empty rootfs that
mounts the host's ``/usr`` and Python read-only. Skips with the reason where it cannot run.
The ``docker_url`` fixture (tests/conftest.py) yields one engine per test session."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

IMAGE = "vfray-test:latest"
PYTHON_ROOT = os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))
VOLUMES = {"/usr": "/usr", PYTHON_ROOT: PYTHON_ROOT}
"""What every test container mounts read-only: the image itself holds no programs."""


def runtime_options(url: str) -> dict[str, object]:
    """``runtime_options`` for a ``docker`` rollout on this engine and image."""
    return {"base_url": url, "default_image": IMAGE, "volumes": dict(VOLUMES)}


def box_options(runtime: str, request: pytest.FixtureRequest) -> dict[str, Any]:
    """``runtime_options`` for a test parametrized over runtimes: for ``docker``, this engine
    and image (the session's ``docker_url``: the test skips where no engine can run); none for
    the others."""
    if runtime != "docker":
        return {}
    return runtime_options(request.getfixturevalue("docker_url"))


def _rootfs() -> bytes:
    """An almost empty rootfs; /usr and the host Python are bind-mounted read-only instead."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name in ("bin", "sbin", "lib", "lib64"):
            link = tarfile.TarInfo(name)
            link.type, link.linkname = tarfile.SYMTYPE, f"usr/{name}"
            tar.addfile(link)
        for name in ("usr", "etc", "tmp", "work", "root", "proc", "sys", "dev"):
            folder = tarfile.TarInfo(name)
            folder.type, folder.mode = tarfile.DIRTYPE, 0o1777 if name == "tmp" else 0o755
            tar.addfile(folder)
        passwd = b"root:x:0:0:root:/root:/bin/sh\n"
        entry = tarfile.TarInfo("etc/passwd")
        entry.size = len(passwd)
        tar.addfile(entry, io.BytesIO(passwd))
    return buffer.getvalue()


@contextlib.contextmanager
def docker_engine() -> Iterator[str]:
    """Start a ``dockerd`` with the test image; yields its ``unix://`` URL, stops it after."""
    dockerd = shutil.which("dockerd")
    if dockerd is None or shutil.which("docker") is None or os.geteuid() != 0:
        pytest.skip(
            "no engine: dockerd/docker not installed (apt-get install docker.io) or not root"
        )
    pytest.importorskip("docker", reason="the docker SDK is missing (pip install 'vfray[docker]')")
    root = Path(tempfile.mkdtemp(prefix="vfray-dockerd-"))
    url = f"unix://{root}/docker.sock"
    log = open(root / "dockerd.log", "wb")  # noqa: SIM115 - lives as long as the daemon
    proc = subprocess.Popen(
        [
            dockerd, "--host", url, "--data-root", str(root / "data"),
            "--exec-root", str(root / "exec"), "--pidfile", str(root / "docker.pid"),
            "--bridge=none", "--iptables=false", "--ip6tables=false",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while subprocess.run(["docker", "-H", url, "info"], capture_output=True).returncode:
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.skip(
                    f"no engine: dockerd did not start: {(root / 'dockerd.log').read_text()[-500:]}"
                )
            time.sleep(0.2)
        env = "ENV PATH=" + os.path.dirname(os.path.realpath(sys.executable)) + ":/usr/bin:/bin"
        made = subprocess.run(
            ["docker", "-H", url, "import", "-c", env, "-", IMAGE],
            input=_rootfs(),
            capture_output=True,
        )
        if made.returncode:
            pytest.skip(f"no engine: cannot import the test image: {made.stderr.decode()}")
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        with contextlib.suppress(OSError):
            subprocess.run(["umount", "-R", str(root)], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)
