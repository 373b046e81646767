"""A task's image unpacked into a root filesystem, once per node and content, for the runtimes
that build a box from a directory (bwrap). As root the layers are untarred where they lie (the
engine's ``docker save`` archive for a Dockerfile or an image the node's Docker engine has, an
OCI layout's blobs: :mod:`vfray.runtimes._image_layers`); other kinds go through ``skopeo copy``
to a layout first. Other users get ``umoci unpack --rootless`` of a layout, and so does an image
whose layers tar cannot apply (one writing through an absolute link a lower layer left).

``<cache>/rootfs/<content key>/`` holds ``rootfs/`` and ``config.json`` (the image's
environment, working dir and user, in the shape umoci writes). It appears only whole: the unpack
runs in a scratch dir and is renamed into place. Nothing writes to it afterwards: boxes mount it
read-only.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import stat
import subprocess
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import BaseModel, ConfigDict

from vfray.errors import SandboxError, optional_import
from vfray.runtimes._executor import blocking, waiting
from vfray.runtimes._image_docker import docker_image
from vfray.runtimes._image_flight import (
    ContentFailure,
    SingleFlight,
    build_slot,
    file_lock,
    image_cache_dir,
    scratch_dir,
)
from vfray.runtimes._image_layers import can_untar, docker_archive, oci_layout, unpack
from vfray.runtimes._image_ref import ImageRef, content_key, parse_image
from vfray.runtimes._trust_policy import local_policy_args

logger = logging.getLogger(__name__)

LAYOUT_TAG = "image"
"""The tag an image copied into a scratch OCI layout gets."""

_FLIGHTS = SingleFlight()


class ImageConfig(BaseModel):
    """What an unpacked image says its processes start with (its OCI config)."""

    model_config = ConfigDict(frozen=True)

    env: dict[str, str]
    workdir: str = "/"
    uid: int = 0
    gid: int = 0
    args: tuple[str, ...] = ()


def image_config(root: Path) -> ImageConfig:
    """The config of the image unpacked at ``root`` (a path :func:`rootfs` returned)."""
    spec = json.loads((root.parent / "config.json").read_text())
    process = spec.get("process") or {}
    env = dict(item.partition("=")[::2] for item in process.get("env") or [])
    user = process.get("user") or {}
    return ImageConfig(
        env=env,
        workdir=process.get("cwd") or "/",
        uid=int(user.get("uid", 0)),
        gid=int(user.get("gid", 0)),
        args=tuple(process.get("args") or ()),
    )


async def rootfs(
    image: str | ImageRef,
    *,
    docker_url: str | None = None,
    make_client: Callable[[], Any] | None = None,
    max_unpacks: int = 2,
) -> Path:
    """The root filesystem of ``image`` (a reference, or one parsed already) on this node,
    unpacked on first use: a directory nothing may write to. ``docker_url`` (``make_client``
    opens a client to it; the docker SDK's by default) names an engine that builds Dockerfiles
    and holds pre-loaded registry images; without one a registry image is read with skopeo,
    and a Dockerfile is refused. Raises :class:`SandboxError` (one line) when the image cannot be
    had or has no ``/bin/sh``; :class:`ConfigError` when ``image`` is malformed."""
    ref = image if isinstance(image, ImageRef) else parse_image(image)
    if docker_url is not None and make_client is None:
        make_client = functools.partial(_client, docker_url)
    key = await blocking(content_key, ref)
    cache = image_cache_dir()
    root = cache / "rootfs" / key / "rootfs"
    if root.is_dir():
        return root

    async def work() -> Path:
        engine_name = None
        if docker_url is not None and ref.transport in ("docker", "dockerfile"):
            assert make_client is not None
            engine_name = await docker_image(ref, make_client, engine=docker_url)
        elif ref.transport == "dockerfile":
            raise SandboxError(
                f"image {str(ref)!r}: building a Dockerfile needs a Docker engine on the node"
            )
        source = ImageSource(ref, engine_name, make_client)
        return await waiting(_unpack, source, key, cache, max_unpacks)

    # Keyed by the root's path: another store (another $VFRAY_IMAGE_CACHE) unpacks its own.
    # The root is not there (above), so a root kept for it was removed since (a pruned store):
    # unpacked again, not handed out.
    _FLIGHTS.forget_result(str(root))
    try:
        return await _FLIGHTS.do(str(root), work)
    except SandboxError as exc:
        raise SandboxError(str(exc)) from None


def _client(url: str) -> Any:
    docker: Any = optional_import("docker", "docker")
    return docker.DockerClient(base_url=url)


@dataclass(frozen=True)
class ImageSource:
    """Where an image's content is read from: its reference, and where the node's Docker engine
    has it (built from a Dockerfile, or found there), the engine's name for it and a client."""

    ref: ImageRef
    engine_name: str | None = None
    make_client: Callable[[], Any] | None = None


def _unpack(source: ImageSource, key: str, cache: Path, slots: int) -> Path:
    ref = source.ref
    dest = cache / "rootfs" / key
    with file_lock(cache / "locks" / f"rootfs-{key}"):
        if (dest / "rootfs").is_dir():
            return dest / "rootfs"
        with build_slot(cache, slots):
            work = scratch_dir(cache)
            try:
                bundle = work / "bundle"
                if can_untar():
                    try:
                        untar_image(source, work, bundle)
                    except ContentFailure as untarred:
                        # A layer that writes through a link a lower one left (an absolute
                        # link, which the box's tar cannot follow inside the image): umoci
                        # follows it inside the root, as the engine did when it built it.
                        logger.warning(
                            "image %r: untarring it failed (%s); unpacking it with umoci instead",
                            str(ref),
                            untarred,
                        )
                        shutil.rmtree(bundle, ignore_errors=True)
                        try:
                            umoci_image(source, work, bundle)
                        except SandboxError as exc:
                            # Both reasons: umoci's alone ("not installed") would hide tar's.
                            raise type(exc)(
                                f"{exc} (untarring it failed first: {untarred})"
                            ) from None
                else:
                    umoci_image(source, work, bundle)
                if not has_shell(bundle / "rootfs"):
                    raise ContentFailure(
                        f"image {str(ref)!r} has no /bin/sh; vfray runs its programs and the "
                        "task's commands through a shell in the box"
                    )
                dest.parent.mkdir(parents=True, exist_ok=True)
                os.rename(bundle, dest)
            finally:
                shutil.rmtree(work, ignore_errors=True)
    return dest / "rootfs"


def untar_image(source: ImageSource, work: Path, bundle: Path) -> None:
    """The image unpacked into ``bundle`` by tar (:mod:`vfray.runtimes._image_layers`): read
    in the engine's archive, in its own OCI layout, or in a layout skopeo copies it to. Raises
    ContentFailure with the reason alone (the caller names the image, then tries umoci)."""
    try:
        if source.engine_name is not None:
            image = docker_archive(_engine_archive(source, work), source.engine_name)
        else:
            layout, tag = _layout(source, work)
            image = oci_layout(Path(layout), tag)
        unpack(image, bundle)
    except (OSError, EOFError, ValueError, KeyError, TypeError, tarfile.TarError) as exc:
        raise ContentFailure(f"{type(exc).__name__}: {exc}") from exc


def umoci_image(source: ImageSource, work: Path, bundle: Path) -> None:
    """The image unpacked into ``bundle`` by ``umoci unpack`` of an OCI layout (a copy in
    ``work`` when it is not one): the way for users other than root."""
    layout, tag = _layout(source, work)
    rootless = ["--rootless"] if os.geteuid() != 0 else []
    _tool(source.ref, "umoci", ["unpack", *rootless, "--image", f"{layout}:{tag}", str(bundle)])


def _engine_archive(source: ImageSource, work: Path) -> Path:
    """The engine's ``docker save`` of the image, in ``work``."""
    assert source.engine_name is not None and source.make_client is not None
    archive = work / "engine.tar"
    if not archive.exists():  # exported whole already when the tar way fell back to umoci
        _export(source.make_client, source.engine_name, archive, source.ref)
    return archive


def _layout(source: ImageSource, work: Path) -> tuple[str, str]:
    """An OCI layout holding the image and its tag there: its own, or a copy in ``work``."""
    ref = source.ref
    if ref.transport == "oci":
        assert ref.path is not None
        return ref.path, ref.reference or only_tag(Path(ref.path))
    copied, transport = str(ref), ref.transport
    if source.engine_name is not None:
        copied, transport = f"docker-archive:{_engine_archive(source, work)}", "docker-archive"
    elif ref.transport == "docker":
        copied = f"docker://{ref.reference}"
    layout = work / "layout"
    policy = local_policy_args("--policy", transport, work)
    _tool(ref, "skopeo", [*policy, "copy", "--quiet", copied, f"oci:{layout}:{LAYOUT_TAG}"])
    return str(layout), LAYOUT_TAG


def only_tag(layout: Path) -> str:
    """An OCI layout's one tag (``latest`` when it has none or several, as umoci assumes)."""
    try:
        index = json.loads((layout / "index.json").read_text())
    except (OSError, ValueError):
        return "latest"
    names = [
        m.get("annotations", {}).get("org.opencontainers.image.ref.name")
        for m in index.get("manifests", [])
    ]
    return names[0] if len(names) == 1 and names[0] else "latest"


def _export(make_client: Callable[[], Any], name: str, archive: Path, ref: ImageRef) -> None:
    client = make_client()
    try:
        with open(archive, "wb") as out:
            for chunk in client.images.get(name).save(named=True):
                out.write(chunk)
    except Exception as exc:
        raise SandboxError(f"cannot export image {str(ref)!r} from the engine: {exc}") from exc
    finally:
        client.close()


def _tool(ref: ImageRef, tool: str, args: list[str]) -> None:
    found = shutil.which(tool)
    if found is None:
        raise SandboxError(f"image {str(ref)!r}: {tool} is not installed (apt-get install {tool})")
    done = subprocess.run([found, *args], capture_output=True, text=True)
    if done.returncode:
        why = " ".join((done.stderr or done.stdout).split())[:600]
        # A registry that failed may answer next time; a file's content will not change.
        failure = SandboxError if ref.transport == "docker" else ContentFailure
        raise failure(f"cannot unpack image {str(ref)!r}: {tool}: {why}")


def has_shell(root: Path) -> bool:
    """Whether ``root`` has an executable ``/bin/sh``, following links as they resolve inside
    ``root`` (``/bin`` is often a link to ``usr/bin``, ``sh`` to ``dash``)."""
    path = PurePosixPath("/bin/sh")
    for _ in range(40):
        resolved = _resolve_parents(root, path)
        if resolved is None:
            return False
        host = root / resolved.relative_to("/")
        try:
            info = os.lstat(host)
        except OSError:
            return False
        if stat.S_ISLNK(info.st_mode):
            target = PurePosixPath(os.readlink(host))
            path = target if target.is_absolute() else resolved.parent / target
            continue
        return stat.S_ISREG(info.st_mode) and bool(info.st_mode & 0o111)
    return False


def _resolve_parents(root: Path, path: PurePosixPath) -> PurePosixPath | None:
    """``path`` with the links among its parent dirs resolved inside ``root``."""
    parts: list[str] = []
    pending = list(path.parts[1:])
    for _ in range(400):
        if len(pending) <= 1:
            return PurePosixPath("/", *parts, *pending)
        head = pending.pop(0)
        if head == "..":
            parts = parts[:-1]
            continue
        if head in ("", "."):
            continue
        host = root.joinpath(*parts, head)
        if host.is_symlink():
            target = PurePosixPath(os.readlink(host))
            if target.is_absolute():
                parts = []
                pending = list(target.parts[1:]) + pending
            else:
                pending = list(target.parts) + pending
            continue
        parts.append(head)
    return None
