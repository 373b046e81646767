"""The root of a bwrap box over an image: the image unpacked and its config read, its root
checked, the box's own copy-on-write layer mounted over it (:mod:`vfray.runtimes._overlay`), the
node's programs that run there through the node's loader (:mod:`vfray.runtimes._foreign_root`),
the box's ``/tmp`` and work dir made in it, and a box path's host path in it."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from vfray.errors import SandboxError
from vfray.runtimes._bwrap_args import BRIDGE_DIR, host_paths
from vfray.runtimes._executor import blocking
from vfray.runtimes._foreign_root import NODE_DIR, NodePrograms, in_root
from vfray.runtimes._overlay import Backend, CowRoot, auto_backend
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


def in_layer(root: Path, box: Path, path: str) -> Path:
    """The host path of the box's absolute path ``box`` (named ``path`` by the caller) in its
    root ``root``, its links resolved inside it; never what the box mounts over its root."""
    for mounted in ("/proc", "/dev", BRIDGE_DIR, NODE_DIR):
        if box == Path(mounted) or Path(mounted) in box.parents:
            raise SandboxError(f"{path!r} is not in the box's root filesystem")
    try:
        return Path(in_root(str(root), str(box)))
    except OSError as exc:
        raise SandboxError(f"cannot resolve {path!r} in the box: {exc}") from exc
