"""Tasks' images on a node: references parsed once (:func:`parse_image`, the containers-image
transport syntax of skopeo and podman plus ``dockerfile:PATH[:CONTEXT]``), and the node's image
store, keyed by content, that makes an image present in a Docker engine
(:func:`docker_image`) or unpacks it into a read-only root filesystem (:func:`rootfs`), each
once per node however many rollouts and processes ask at once.

The store lives in ``$VFRAY_IMAGE_CACHE`` (default ``~/.cache/vfray/images``) on the node's own
disk; unpacked roots are never evicted by vfray.
"""

from __future__ import annotations

from collections.abc import Sequence

from vfray.runtimes._image_docker import IMAGE_REPOSITORY, docker_image
from vfray.runtimes._image_docker import forget as forget_docker_image
from vfray.runtimes._image_flight import CACHE_ENV, image_cache_dir
from vfray.runtimes._image_ref import ImageRef, content_key, parse_image
from vfray.runtimes._image_rootfs import ImageConfig, has_shell, image_config, rootfs
from vfray.runtimes.base import Runtime

__all__ = [
    "CACHE_ENV",
    "IMAGE_REPOSITORY",
    "ImageConfig",
    "ImageRef",
    "content_key",
    "docker_image",
    "forget_docker_image",
    "has_shell",
    "image_cache_dir",
    "image_config",
    "parse_image",
    "refuse_image",
    "rootfs",
    "runs_images",
]


def runs_images(runtime: type[Runtime]) -> bool:
    """Whether boxes of ``runtime`` can have a task's image as their root (its
    :attr:`~vfray.runtimes.base.Runtime.RUNS_IMAGES`)."""
    return runtime.RUNS_IMAGES


def refuse_image(runtime_type: str, image_runtimes: Sequence[str]) -> str:
    """Why a task's image cannot run in ``runtime_type``, naming the runtimes that can."""
    can = ", ".join(repr(name) for name in image_runtimes) or "'docker' or 'modal'"
    return (
        f"the task names an image, and runtime {runtime_type!r} cannot run images; "
        f"use a runtime that can: {can}"
    )
