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
        end = tar.offset + 2 * tarfile.BLOCKSIZE
    return _unpadded(buffer, end)


def dir_tar(name: str, ids: tuple[int, int] | None) -> bytes:
    """A tar of one dir ``name`` (mode 0755), owned by ``ids`` (uid, gid) when given."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        member = tarfile.TarInfo(name)
        member.type, member.mode, member.mtime = tarfile.DIRTYPE, 0o755, int(time.time())
        if ids is not None:
            member.uid, member.gid = ids
        tar.addfile(member)
        end = tar.offset + 2 * tarfile.BLOCKSIZE
    return _unpadded(buffer, end)


def owned_tar(data: bytes, ids: tuple[int, int]) -> bytes:
    """The tar ``data`` (a dir read out of a container) with every member owned by ``ids``."""
    buffer = io.BytesIO()
    with (
        tarfile.open(fileobj=io.BytesIO(data)) as source,
        tarfile.open(fileobj=buffer, mode="w") as tar,
    ):
        for member in source:
            member.uid, member.gid = ids
            member.uname = member.gname = ""
            tar.addfile(member, source.extractfile(member) if member.isfile() else None)
        end = tar.offset + 2 * tarfile.BLOCKSIZE
    return _unpadded(buffer, end)


def tar_files(data: bytes, limit: int) -> dict[str, bytes]:
    """The regular files of the tar ``data`` (a dir read out of a container: its members
    under the dir's own name), ``limit`` at most, by their path under that dir."""
    files: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for member in tar:
            _, _, name = member.name.partition("/")
            handle = tar.extractfile(member) if member.isfile() and name else None
            if handle is not None:
                files[name] = handle.read()
                if len(files) >= limit:
                    break
    return files


def _unpadded(buffer: io.BytesIO, end: int) -> bytes:
    """The tar up to its end-of-archive blocks, without the zeros ``tarfile`` pads it with to a
    whole 10 KiB record: podman 4.3's ``cp -`` stops reading at the end blocks and, when more
    than a little padding follows, fails the copy with ``io: read/write on closed pipe`` (seen
    for files of 30,000-31,000 bytes; docker takes either)."""
    return buffer.getvalue()[:end]


def untar_file(data: bytes, path: str) -> bytes:
    """The content of the first member of the tar ``data`` (the file ``path`` read out)."""
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        member = tar.next()
        handle = tar.extractfile(member) if member is not None else None
        if handle is None:
            raise SandboxError(f"{path!r} is not a regular file")
        return handle.read()
