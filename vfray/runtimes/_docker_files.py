"""The docker box's file hand-over through the engine's archive API: files written and read as
tars (``put_archive`` / ``get_archive``, owned by the box's user where one is set), and the work
dir given to that user, which the capless box could not do from inside."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

from vfray.errors import SandboxError
from vfray.runtimes._box_files import dir_tar, file_tar, untar_file
from vfray.runtimes._container_box import ContainerBox
from vfray.runtimes._executor import blocking


class DockerFiles(ContainerBox):
    """File hand-over for :class:`~vfray.runtimes.docker.DockerRuntime` (its base)."""

    user: str | None
    _ids: tuple[int, int] | None

    def _box_path(self, path: str) -> PurePosixPath:
        return PurePosixPath(self.box_workdir, path)

    async def _give_dir(self, path: PurePosixPath) -> None:
        assert self._ids is not None
        archive = dir_tar(path.name, self._ids)
        if not await blocking(self._require().put_archive, str(path.parent), archive):
            raise SandboxError(f"cannot hand {path} to user {self.user}")

    async def _put(self, path: PurePosixPath, data: bytes, mode: int) -> None:
        await self._put_at(path, file_tar(path.name, data, mode, self._ids))

    async def _put_tar(
        self, parent: PurePosixPath, archive: bytes, *, keep_ids: bool = False
    ) -> str | None:
        # The engine always keeps the tar's ids.
        container = self._require()
        try:
            ok = await blocking(container.put_archive, str(parent), archive)
        except Exception as exc:  # the engine's NotFound for a missing dir, among others
            return " ".join(str(getattr(exc, "explanation", None) or exc).split())[:300]
        return None if ok else "the engine refused the archive"

    async def _get_tar(self, path: PurePosixPath) -> bytes | None:
        container = self._require()

        def _get() -> bytes | None:
            try:
                chunks, _ = container.get_archive(str(path))
            except Exception as exc:
                if getattr(getattr(exc, "response", None), "status_code", None) == 404:
                    return None
                raise SandboxError(f"cannot read {path}: {exc}") from exc
            return b"".join(chunks)

        return await blocking(_get)

    async def write(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        await self._put(self._box_path(path), data, mode)

    async def read(self, path: str) -> bytes:
        container: Any = self._require()
        target = self._box_path(path)

        def _read() -> bytes:
            chunks, stat = container.get_archive(str(target))
            link = stat.get("linkTarget") if isinstance(stat, dict) else None
            if link:
                # The archive of a link is the link: its target, as the engine resolved it in
                # the container (never outside it), is the file the box reads there.
                chunks, _ = container.get_archive(str(link))
            return untar_file(b"".join(chunks), path)

        try:
            return await blocking(_read)
        except SandboxError:
            raise
        except Exception as exc:
            raise SandboxError(f"cannot read {path!r}: {exc}") from exc
