"""The root of a bwrap box over an image: the image unpacked and its config read, its root
checked, the box's own copy-on-write layer mounted over it (:mod:`vfray.runtimes._overlay`), the
node's programs that run there through the node's loader (:mod:`vfray.runtimes._foreign_root`),
the box's ``/tmp`` and work dir made in it, and a box path's host path in it."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

from vfray.errors import SandboxError
from vfray.runtimes._bwrap_args import (
    BRIDGE_DIR,
    IMAGE_PATH,
    give_owned,
    host_paths,
    image_mounts,
    read_user_ids,
)
from vfray.runtimes._executor import blocking
from vfray.runtimes._foreign_root import NODE_DIR, NodePrograms, in_root
from vfray.runtimes._overlay import Backend, CowRoot, auto_backend
from vfray.runtimes.base import RuntimeSpec
from vfray.runtimes.images import ImageConfig, image_config, rootfs
from vfray.runtimes.provision import tools_root


async def unpacked(
    image: str | None, image_root: str | None, docker_url: str | None
) -> tuple[str | None, ImageConfig | None]:
    """The root of the box (``image_root``, else ``image`` unpacked on this node: once per node
    and content) and, when it is an unpacked image's, the image's config."""
    if image_root is None and image is not None:
        image_root = str(await rootfs(image, docker_url=docker_url))
    if image_root is None:
        return None, None
    root = Path(image_root)
    if not (root.parent / "config.json").is_file():  # a bare dir, not an unpacked image
        return image_root, None
    try:
        return image_root, await blocking(image_config, root)
    except (OSError, ValueError) as exc:
        raise SandboxError(f"cannot read the config of image root {root}: {exc}") from exc


def box_layer(
    lower: str,
    base: Path,
    overlay: Backend | None,
    *,
    require_shell: bool,
    image_name: str | None,
) -> CowRoot:
    """The box's layer over the image root ``lower``, under ``base``, not mounted yet
    (``overlay`` None: the best backend this node has), blocking. A root with no ``/bin/sh``
    is refused when ``require_shell``."""
    if not os.path.isdir(lower):
        raise SandboxError(f"image root {lower} is not a directory")
    if require_shell and not os.path.lexists(in_root(lower, "/bin/sh")):
        raise SandboxError(
            f"image root {lower} (image {image_name or '?'}) has no /bin/sh: "
            "agent programs and scoring hooks start through it; use an image with a shell"
        )
    backend = auto_backend(str(base.parent)) if overlay is None else overlay
    return CowRoot(lower, base / "layer", backend)


def mount_box_root(
    layer: CowRoot, ro_binds: Sequence[str], box_workdir: str
) -> tuple[NodePrograms, Path]:
    """``layer`` mounted, the node's programs in it, and its ``/tmp`` and work dir
    ``box_workdir`` made (its host path returned), blocking. The caller holds ``layer``
    first, so that its stop unmounts whatever part of this was done."""
    root = str(layer.mount())
    tools = str(tools_root())
    node_paths = host_paths(ro_binds) + ([tools] if os.path.isdir(tools) else [])
    node = NodePrograms(node_paths, root)
    try:
        tmp = in_root(root, "/tmp")
        os.makedirs(tmp, exist_ok=True)
        os.chmod(tmp, 0o1777)
        workdir = in_root(root, box_workdir)
        os.makedirs(workdir, exist_ok=True)
    except OSError as exc:
        raise SandboxError(f"cannot make {box_workdir} in image root {layer.lower}: {exc}") from (
            exc
        )
    return node, Path(workdir)


def refuse_mounted(box: Path, path: str) -> None:
    """SandboxError when the box's absolute path ``box`` (named ``path``) is under what the
    box mounts over its root (its ``/proc``, ``/dev``, bridges and node programs)."""
    for mounted in ("/proc", "/dev", BRIDGE_DIR, NODE_DIR):
        if box == Path(mounted) or Path(mounted) in box.parents:
            raise SandboxError(f"{path!r} is not in the box's root filesystem")


def in_layer(root: Path, box: Path, path: str) -> Path:
    """The host path of the box's absolute path ``box`` (named ``path`` by the caller) in its
    root ``root``, its links resolved inside it; never what the box mounts over its root."""
    refuse_mounted(box, path)
    try:
        return Path(in_root(str(root), str(box)))
    except OSError as exc:
        raise SandboxError(f"cannot resolve {path!r} in the box: {exc}") from exc


class ImageBox:
    """The image side of :class:`vfray.runtimes.bwrap.BwrapRuntime` (a mixin ahead of its
    runtime base): the image unpacked and read, the box's root over it, its mounts, and how
    the node's programs and the image's users run there. The runtime sets the attributes."""

    spec: RuntimeSpec
    image_root: str | None
    image: ImageConfig | None
    docker_url: str | None
    overlay: Literal["auto", "kernel", "fuse", "copy"]
    require_shell: bool
    ro_binds: tuple[str, ...]
    box_workdir: str
    box_ids: tuple[int, int]
    layer: CowRoot | None
    node: NodePrograms | None
    base: Path | None
    workdir: Path | None
    program_user: str | None

    async def prepare_image(self) -> None:
        """The task's image unpacked on this node (once per node and content) and its config
        read: the box's root, environment, default work dir and user."""
        if self.image is not None:
            return
        self.image_root, self.image = await unpacked(
            self.spec.image, self.image_root, self.docker_url
        )
        if self.image is not None:
            if self.spec.workdir is None and self.image.workdir not in ("", "/"):
                self.box_workdir = self.image.workdir
            self.box_ids = (self.image.uid, self.image.gid)

    async def _start_image(self, base: Path) -> None:
        """The box's own root over the image's: its layer mounted, its work dir made."""
        assert self.image_root is not None
        overlay = None if self.overlay == "auto" else self.overlay
        self.layer = await blocking(
            box_layer,
            self.image_root,
            base,
            overlay,
            require_shell=self.require_shell,
            image_name=self.spec.image,
        )
        self.node, self.workdir = await blocking(
            mount_box_root, self.layer, self.ro_binds, self.box_workdir
        )

    def _image_mounts(self) -> list[str]:
        """A box over an image: its layer as ``/``, the node's programs read-only on top."""
        assert self.base is not None and self.layer is not None and self.node is not None
        return image_mounts(self.base, self.layer.root, self.node, self.box_ids, self.box_workdir)

    async def program_user_ready(self) -> str | None:
        """:attr:`program_user`; in a box over an image a root node unpacked (owners kept),
        what the image gave that user under the work dir (``chown agent /app``) is given to
        the node's user first: the user namespace maps only the program's uid, onto the
        node's, and would leave that user's own files read-only to it."""
        user = self.program_user
        if user is None or self.layer is None or os.geteuid() != 0:
            return user
        ids = self._user_ids(user)
        top = Path(in_root(str(self.layer.root), self.box_workdir))
        await blocking(give_owned, top, ids, (os.getuid(), os.getgid()))
        return user

    def _user_ids(self, user: str) -> tuple[int, int]:
        """``user``'s ids by the box root's ``/etc/passwd`` and ``/etc/group``. The user
        namespace maps just that uid to the node's user: the box's files are its own."""
        assert self.base is not None
        if self.layer is not None:
            files = [in_root(str(self.layer.root), f"/etc/{n}") for n in ("passwd", "group")]
        else:
            files = [str(self.base / "etc" / n) for n in ("passwd", "group")]
        return read_user_ids(user, *files)

    def program_argv(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> list[str]:
        if self.node is None:
            return list(argv)
        return self.node.argv(argv, {"PATH": self._image_env()["PATH"], **(env or {})})

    def _image_env(self) -> dict[str, str]:
        """The environment the image sets (its config's), ``PATH`` always among it."""
        env = dict(self.image.env) if self.image is not None else {}
        env.setdefault("PATH", IMAGE_PATH)
        return env
