"""Tar streams carrying one file or dir into a container and one file out of it, as the docker
engine's archive API and ``podman cp`` take and give them."""

from __future__ import annotations

import io
import tarfile
import time

from vfray.errors import SandboxError


def file_tar(name: str, data: bytes, mode: int, ids: tuple[int, int] | None) -> bytes:
    """A tar of one file ``name`` holding ``data``, owned by ``ids`` (uid, gid) when given."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        member = tarfile.TarInfo(name)
        member.size, member.mode, member.mtime = len(data), mode, int(time.time())
        if ids is not None:
            member.uid, member.gid = ids
        tar.addfile(member, io.BytesIO(data))
    return buffer.getvalue()


def dir_tar(name: str, ids: tuple[int, int] | None) -> bytes:
    """A tar of one dir ``name`` (mode 0755), owned by ``ids`` (uid, gid) when given."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        member = tarfile.TarInfo(name)
        member.type, member.mode, member.mtime = tarfile.DIRTYPE, 0o755, int(time.time())
        if ids is not None:
            member.uid, member.gid = ids
        tar.addfile(member)
    return buffer.getvalue()


def untar_file(data: bytes, path: str) -> bytes:
    """The content of the first member of the tar ``data`` (the file ``path`` read out)."""
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        member = tar.next()
        handle = tar.extractfile(member) if member is not None else None
        if handle is None:
            raise SandboxError(f"{path!r} is not a regular file")
        return handle.read()
