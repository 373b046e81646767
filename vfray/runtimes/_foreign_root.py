"""Internal: the node's own programs (its Python, the agents' tool dir) run inside a box whose
root is an image, through the node's dynamic loader mounted in.

A node program is dynamically linked against the node's glibc; the image may have another libc,
or none (busybox, musl, a bare root). So the node's loader and library dirs are mounted
read-only under :data:`NODE_DIR` and such a program starts as ``NODE_DIR/lib0/ld-linux… \
--library-path DIRS PROGRAM ARGS``: nothing of the image's own interpreters, libraries or
site-packages is used, and the image's ``python3`` stays the image's (``--library-path`` is not
inherited by the program's children, unlike ``LD_LIBRARY_PATH``). Scripts are followed through
their ``#!`` line (``#!/usr/bin/env node`` included) to the node binary that runs them.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

NODE_DIR = "/run/vfray-node"
"""Where a box over an image sees the node's loader and library dirs."""
_MAX_SHEBANG_DEPTH = 4
_SYSTEM_LIBDIRS = (
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/lib64",
    "/usr/lib64",
)
"""The node's library dirs (Debian's multiarch dirs, other distributions' lib64)."""
HOST_PROGRAMS = ("node",)
"""Interpreters a node script may name (``#!/usr/bin/env node``) that the tool dir need not
bring: the node's own, from its ``PATH``, mounted at ``NODE_DIR/bin`` (an npm agent without a
Node.js of its own in its tool dir, codex, runs with the node's)."""


@functools.cache
def _interpreter(path: str) -> str | None:
    """The ``PT_INTERP`` (dynamic loader) of the ELF file at ``path``; None for anything else
    (a static binary, a script)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(64)
            if head[:4] != b"\x7fELF" or head[4] != 2:  # 64-bit ELF only
                return None
            order: Literal["little", "big"] = "little" if head[5] == 1 else "big"
            phoff = int.from_bytes(head[32:40], order)
            phentsize = int.from_bytes(head[54:56], order)
            phnum = int.from_bytes(head[56:58], order)
            fh.seek(phoff)
            table = fh.read(phentsize * phnum)
            for i in range(phnum):
                entry = table[i * phentsize : (i + 1) * phentsize]
                if int.from_bytes(entry[:4], order) == 3:  # PT_INTERP
                    offset = int.from_bytes(entry[8:16], order)
                    size = int.from_bytes(entry[32:40], order)
                    fh.seek(offset)
                    return fh.read(size).rstrip(b"\0").decode()
    except (OSError, ValueError, IndexError):
        return None
    return None


@functools.cache
def _linked_dirs(path: str) -> tuple[str, ...]:
    """The dirs the node's loader finds ``path``'s libraries in (its RUNPATH, e.g. pyenv's
    ``lib``), in order. ``--library-path`` wins over RUNPATH, so they must be named first: the
    node's system dir may hold another build of the same library (Debian's libpython3.11)."""
    try:
        done = subprocess.run(
            ["ldd", path], capture_output=True, text=True, timeout=30, env={"LC_ALL": "C"}
        )
    except (OSError, subprocess.TimeoutExpired):
        return ()
    dirs: list[str] = []
    for line in done.stdout.splitlines():
        _, arrow, rest = line.partition("=>")
        target = rest.strip().split(" (")[0] if arrow else ""
        if target.startswith("/"):
            directory = os.path.dirname(os.path.realpath(target))
            if directory not in dirs:
                dirs.append(directory)
    return tuple(dirs)


class NodePrograms:
    """The node's loader and libraries, and how one of the node's programs starts in the box.

    ``node_paths``: host dirs mounted into the box at their own paths (the node's Python, the
    tool dir); only programs under them are the node's. ``root``: the box's root on the host."""

    def __init__(self, node_paths: Iterable[str], root: str) -> None:
        self.node_paths = tuple(os.path.normpath(p) for p in node_paths)
        self.root = root
        loader = _interpreter(os.path.realpath(sys.executable)) or "/lib64/ld-linux-x86-64.so.2"
        self.host_loader = os.path.realpath(loader)
        libdirs = [os.path.dirname(self.host_loader)]
        for d in _SYSTEM_LIBDIRS:
            real = os.path.realpath(d)
            if os.path.isdir(real) and real not in libdirs:
                libdirs.append(real)
        self.libdirs = {real: f"{NODE_DIR}/lib{i}" for i, real in enumerate(libdirs)}
        self.loader = f"{NODE_DIR}/lib0/{os.path.basename(self.host_loader)}"
        self.host_programs: dict[str, str] = {}
        """Box path -> host file of each of :data:`HOST_PROGRAMS` the node has."""
        for name in HOST_PROGRAMS:
            found = shutil.which(name)
            if found:
                self.host_programs[f"{NODE_DIR}/bin/{name}"] = os.path.realpath(found)

    def mounts(self) -> list[str]:
        """bubblewrap arguments mounting the node's library dirs (read-only)."""
        args: list[str] = []
        for real, inside in self.libdirs.items():
            args += ["--ro-bind", real, inside]
        for inside, real in self.host_programs.items():
            args += ["--ro-bind", real, inside]
        return args

    def _is_node(self, path: str) -> bool:
        # The box path as written: a node dir is mounted at its own path, anything else in the
        # box is the image's (whatever the host has at that path).
        path = os.path.normpath(path)
        return any(path == p or path.startswith(p.rstrip("/") + "/") for p in self.node_paths)

    def _which(self, name: str, env: Mapping[str, str], *, for_node: bool = False) -> str | None:
        """``name`` as the box's PATH finds it, when that is a node program (a node dir holds
        it before any image dir does). ``for_node``: the interpreter of a node script, which is
        never the image's: a node dir on PATH, else the node's own (:data:`HOST_PROGRAMS`)."""
        for directory in env.get("PATH", "").split(":"):
            if not os.path.isabs(directory):
                continue
            if self._is_node(directory):
                candidate = os.path.join(directory, name)
                if os.access(candidate, os.X_OK):
                    return candidate
            elif not for_node and os.path.lexists(
                os.path.join(self.root, directory.lstrip("/"), name)
            ):
                return None  # the image's own
        fallback = f"{NODE_DIR}/bin/{name}"
        return fallback if for_node and fallback in self.host_programs else None

    def _library_path(self, binary: str) -> str:
        dirs = [self.libdirs.get(d, d) for d in _linked_dirs(binary)]
        for inside in self.libdirs.values():
            if inside not in dirs:
                dirs.append(inside)
        return ":".join(d for d in dirs if d.startswith(NODE_DIR) or self._is_node(d))

    def argv(self, argv: Sequence[str], env: Mapping[str, str], depth: int = 0) -> list[str]:
        """``argv`` as the box must start it: through the node's loader when ``argv[0]`` is a
        dynamically linked node program (or a script a node program runs); else unchanged."""
        if not argv or depth > _MAX_SHEBANG_DEPTH:
            return list(argv)
        program = argv[0]
        if "/" not in program:
            found = self._which(program, env, for_node=depth > 0)
            if found is None:
                return list(argv)
            program = found
        if program in self.host_programs:
            real = self.host_programs[program]
        elif self._is_node(program):
            real = os.path.realpath(program)
        else:
            return list(argv)
        if _interpreter(real) is not None:
            # The program's own path as argv[0] (the loader passes it on): a venv's Python
            # finds its pyvenv.cfg from it.
            return [self.loader, "--library-path", self._library_path(real), program, *argv[1:]]
        try:
            with open(real, "rb") as fh:
                first = fh.readline(256)
        except OSError:
            return list(argv)
        if not first.startswith(b"#!"):
            return list(argv)
        words = first[2:].decode(errors="replace").strip().split(None, 1)
        if not words:
            return list(argv)
        interpreter, rest = words[0], words[1:]
        if os.path.basename(interpreter) == "env" and rest:
            # "#!/usr/bin/env node": the program named, as the box's PATH would find it.
            inner = rest[0].split()
            if inner and inner[0] == "-S":
                inner = inner[1:]
            return self.argv([*inner, program, *argv[1:]], env, depth + 1)
        return self.argv([interpreter, *rest, program, *argv[1:]], env, depth + 1)


def in_root(root: str, path: str, *, hops: int = 40) -> str:
    """The host path of the absolute box ``path`` in the root filesystem at ``root``, following
    symlinks as the box would (an absolute target is inside ``root``; ``..`` stops at it), so
    a link planted in the box never leads a host-side read or write out of it."""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    done: list[str] = []
    while parts:
        part = parts.pop(0)
        if part == "..":
            if done:
                done.pop()
            continue
        candidate = os.path.join(root, *done, part)
        if os.path.islink(candidate):
            hops -= 1
            if hops < 0:
                raise OSError(f"too many levels of symbolic links in {path!r}")
            target = os.readlink(candidate)
            if target.startswith("/"):
                done = []
            parts = [p for p in target.split("/") if p not in ("", ".")] + parts
            continue
        done.append(part)
    return os.path.join(root, *done)
