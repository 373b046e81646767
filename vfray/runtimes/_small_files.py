"""Small box files read and written on the event loop itself, where that cannot block.

A thread hop (the runtimes' pool, :mod:`vfray.runtimes._executor`) costs the owner more CPU than
reading or writing a few KB of a local file: a bash rollout writes its prompt, its key and its
program and reads the file it is scored on, ~0.1 ms of CPU each in hops. A file the box's
programs could have replaced by a FIFO or a device must still never stall the loop, so both
calls open without blocking and give up (None / False: the caller goes to its thread) on
anything but a regular file of at most :data:`INLINE_BYTES`.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

INLINE_BYTES = 64 * 1024
"""Files up to this size are read or written on the loop."""


def read_small(path: Path) -> bytes | None:
    """The file's bytes when it is a regular file of at most :data:`INLINE_BYTES`, else None;
    OSError as reading it would raise it."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > INLINE_BYTES:
            return None
        chunks = []
        while chunk := os.read(fd, INLINE_BYTES + 1):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def write_small(path: Path, data: bytes, mode: int) -> bool:
    """Write ``data`` (its parent dirs made) and set ``mode``, when ``data`` is at most
    :data:`INLINE_BYTES` and the path is, or becomes, a regular file; False (nothing written)
    otherwise. OSError as writing it would raise it. A new file is created with ``mode``, so a
    key written 0o600 is never readable by others, even for a moment."""
    if len(data) > INLINE_BYTES:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC, mode & 0o777)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a FIFO nobody reads; the thread waits for a reader
            return False
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        os.ftruncate(fd, 0)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
    return True
