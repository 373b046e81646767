"""Internal: a box's file opened from the host as the box would find it, never outside it.

vfray reads and writes a bwrap box's files from the host, as the node's user (root on most
nodes): a reward reads the answer file, a harness writes its next prompt between segments. The
box's programs can make symbolic links in their own dirs, and a plain ``open`` on the host
follows a link in the host's namespace: a box that linked ``answer.txt`` to a file it cannot see
(``/root/.ssh/id_rsa``) had the host read it for the reward, and one that linked a file a
harness writes later had the host write through it, anywhere. :func:`open_in_box` walks the
path one component at a time from an open dir (``openat`` with ``O_NOFOLLOW``), so no link is
followed by the kernel. A link met on the way is read and followed as the box would follow
it (an absolute target from the box's root, ``..`` one box dir up), and where it leads must
again be in one of the box's :class:`Mount` dirs. The box may swap a component for a link while
this runs: each step opens what is there at that moment, without following it, so a swap makes
the open fail or follow the new link by these same rules, never the host's.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Sequence
from dataclasses import dataclass

from vfray.errors import SandboxError

_DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_LINKS = 40
"""Links followed in one path at most (the kernel's own limit): a loop ends with ELOOP."""


@dataclass(frozen=True)
class Mount:
    """A box dir at ``box`` (absolute, normalized) that is the host dir ``host``."""

    box: str
    host: str

    @property
    def parts(self) -> tuple[str, ...]:
        return _parts(self.box)


def _parts(path: str) -> tuple[str, ...]:
    return tuple(p for p in path.split("/") if p not in ("", "."))


def open_in_box(
    mounts: Sequence[Mount],
    path: str,
    flags: int,
    mode: int = 0o644,
    *,
    cwd: str = "/",
    make_parents: bool = False,
    what: str = "the box's writable dirs",
) -> int:
    """A file descriptor of the box's ``path`` (relative to the box dir ``cwd``), opened with
    ``flags`` (``O_NOFOLLOW`` and ``O_CLOEXEC`` added) and ``mode``, its links followed as the
    box would follow them. ``make_parents``: missing dirs on the way are made (0o777, less the
    umask, as ``Path.mkdir`` makes them). Raises :class:`SandboxError` naming ``what`` when the
    path, or a link on it, leads out of ``mounts`` (a mount inside another one is seen over
    it, as the box sees it), and OSError as the open (or a dir on the way) would raise it."""
    todo = [*(_parts(cwd) if not path.startswith("/") else ()), *_parts(path)]
    todo.reverse()  # popped from the end: the next component last
    resolved: list[str] = []  # the box dir reached, every component a real dir of it
    fd: int | None = None  # that dir's descriptor, once inside a mount
    hops = MAX_LINKS
    try:
        while todo:
            if fd is None and not resolved and (root := _mount_at(mounts, ())) is not None:
                fd = os.open(root.host, _DIR_FLAGS)  # a box whose root is a host dir
            part = todo.pop()
            if part == "..":
                # Up one dir, walked again from the box's root: it may leave a mount, or come
                # back out from under one mounted over another's dir.
                todo.extend(reversed(resolved[:-1]))
                resolved, fd = [], _closed(fd)
                continue
            resolved.append(part)
            last = not todo
            mount = _mount_at(mounts, resolved)
            if mount is not None:  # the box sees this mount here, over whatever was below
                if last:
                    raise IsADirectoryError(errno.EISDIR, "is a dir of the box", path)
                fd = _closed(fd)
                fd = os.open(mount.host, _DIR_FLAGS)
                continue
            if fd is None:  # above every mount: only the way to one is in the box
                if last or not _leads_to_mount(mounts, resolved):
                    raise SandboxError(f"{path!r} leads outside {what}")
                continue
            opened = _step(fd, part, flags, mode, last, make_parents)
            if isinstance(opened, str):
                hops -= 1
                if hops < 0:
                    raise OSError(errno.ELOOP, "too many levels of symbolic links", path)
                # Followed as the box follows it: an absolute target from the box's root, a
                # relative one from the dir holding the link; then what came after the link.
                resolved.pop()
                todo.extend(reversed(_parts(opened)))
                if opened.startswith("/"):
                    resolved, fd = [], _closed(fd)
                continue
            if last:
                return opened
            os.close(fd)
            fd = opened
        raise IsADirectoryError(errno.EISDIR, "is a dir of the box", path)
    finally:
        _closed(fd)


def _closed(fd: int | None) -> int | None:
    """None, once ``fd`` (if any) is closed: ``fd = _closed(fd)``."""
    if fd is not None:
        os.close(fd)
    return None


def _step(fd: int, part: str, flags: int, mode: int, last: bool, make: bool) -> int | str:
    """Open ``part`` in the dir ``fd`` (the path's last component with ``flags``, else as a dir
    to walk on): its descriptor, or the target of the link found there."""
    while True:
        try:
            if last:
                return os.open(part, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=fd)
            return os.open(part, _DIR_FLAGS, dir_fd=fd)
        except OSError as exc:
            # O_NOFOLLOW meeting a link: ELOOP for a file, ENOTDIR where a dir was asked for
            # (as for any other non-dir: the link is read to tell them apart).
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                try:
                    return os.readlink(part, dir_fd=fd)
                except OSError:
                    raise exc from None
            if exc.errno == errno.ENOENT and make and not last:
                # Made, or made meanwhile (then opened, or a link made meanwhile read, next).
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o777, dir_fd=fd)
                continue
            raise


def _mount_at(mounts: Sequence[Mount], parts: Sequence[str]) -> Mount | None:
    key = tuple(parts)
    for mount in mounts:
        if mount.parts == key:
            return mount
    return None


def _leads_to_mount(mounts: Sequence[Mount], parts: Sequence[str]) -> bool:
    n = len(parts)
    return any(len(m.parts) > n and m.parts[:n] == tuple(parts) for m in mounts)
