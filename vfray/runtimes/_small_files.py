"""Small box files read and written on the event loop itself, where that cannot block.

A thread hop (the runtimes' pool, :mod:`vfray.runtimes._executor`) costs the owner more CPU than
reading or writing a few KB of a local file: a bash rollout writes its prompt, its key and its
program and reads the file it is scored on, ~0.1 ms of CPU each in hops. A file the box's
programs could have replaced by a FIFO or a device must still never stall the loop, so both
calls open without blocking and give up (None / False: the caller goes to its thread) on
anything but a regular file of at most :data:`INLINE_BYTES`. :func:`read_file` and
:func:`write_file` are those threads' whole reads and writes.

Every call opens through an :data:`Opener` (the runtime's: a box's own
:func:`~vfray.runtimes._box_paths.open_in_box`, so no link the box made is followed out of it)
and then works on that descriptor only.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable

INLINE_BYTES = 64 * 1024
"""Files up to this size are read or written on the loop."""

Opener = Callable[[int, int], int]
"""Opens the file with (flags, mode): a descriptor, or OSError. A runtime's opener for one path
(parent dirs made when the flags create it)."""

_READ = os.O_RDONLY | os.O_CLOEXEC
_WRITE = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC


def read_small(opener: Opener) -> bytes | None:
    """The file's bytes when it is a regular file of at most :data:`INLINE_BYTES`, else None;
    OSError as reading it would raise it."""
    fd = opener(_READ | os.O_NONBLOCK, 0)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > INLINE_BYTES:
            return None
        return _read_all(fd)
    finally:
        os.close(fd)


def write_small(opener: Opener, data: bytes, mode: int) -> bool:
    """Write ``data`` (its parent dirs made) and set ``mode``, when ``data`` is at most
    :data:`INLINE_BYTES` and the path is, or becomes, a regular file; False (nothing written)
    otherwise. OSError as writing it would raise it. A new file is created with ``mode``, so a
    key written 0o600 is never readable by others, even for a moment."""
    if len(data) > INLINE_BYTES:
        return False
    try:
        fd = opener(_WRITE | os.O_NONBLOCK, mode & 0o777)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a FIFO nobody reads; the thread waits for a reader
            return False
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        os.ftruncate(fd, 0)
        _write_all(fd, data, mode)
    finally:
        os.close(fd)
    return True


def read_file(opener: Opener) -> bytes:
    """The whole file, however large and whatever it is (blocking: a thread's call)."""
    fd = opener(_READ, 0)
    try:
        return _read_all(fd)
    finally:
        os.close(fd)


def write_file(opener: Opener, data: bytes, mode: int) -> None:
    """``data`` as the whole file, then ``mode`` (blocking: a thread's call)."""
    fd = opener(_WRITE | os.O_TRUNC, mode & 0o777)
    try:
        _write_all(fd, data, mode)
    finally:
        os.close(fd)


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, INLINE_BYTES + 1):
        chunks.append(chunk)
    return b"".join(chunks)


def _write_all(fd: int, data: bytes, mode: int) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.fchmod(fd, mode)
