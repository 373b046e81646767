"""Image references, parsed once into a frozen :class:`ImageRef`, and the content key a node's
image store files each one under (:func:`content_key`).

The syntax is the containers-image transport syntax of skopeo and podman, plus one of ours:

- a registry reference: ``debian:bookworm``, ``ghcr.io/x/y@sha256:<hex>`` (``docker://`` may
  prefix it);
- ``docker-archive:PATH[:REFERENCE]``: a ``docker save`` tarball (REFERENCE picks one image of
  an archive holding several);
- ``oci:PATH[:TAG]``: an OCI image layout directory (TAG defaults to its only tag, else
  ``latest``);
- ``oci-archive:PATH[:TAG]``: a tarball of an OCI layout;
- ``dockerfile:PATH[:CONTEXT]``: a Dockerfile (PATH is the file, or a directory holding
  ``Dockerfile``) built with CONTEXT as its build context (default: the Dockerfile's directory).

As in skopeo, a path ends at its first ``:``. Relative paths are resolved against the current
directory of the process that parses them: give absolute paths to a run on a cluster.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from vfray.errors import ConfigError, SandboxError

Transport = Literal["docker", "docker-archive", "oci", "oci-archive", "dockerfile"]

_DOMAIN = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*"
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REFERENCE = re.compile(
    rf"(?:{_DOMAIN}(?::[0-9]+)?/)?{_COMPONENT}(?:/{_COMPONENT})*"
    r"(?::[\w][\w.-]{0,127})?(?:@sha256:[0-9a-f]{64})?"
)
"""A registry reference, as Docker's distribution/reference grammar has it."""

_UNSUPPORTED = ("containers-storage", "dir", "docker-daemon", "ostree", "sif", "tarball")
"""Transports skopeo knows that no runtime here reads."""

_SYNTAX = (
    "expected a registry reference (debian:bookworm), docker-archive:PATH, oci:PATH[:TAG], "
    "oci-archive:PATH[:TAG] or dockerfile:PATH[:CONTEXT]"
)


class ImageRef(BaseModel):
    """One image, as a task names it: where it comes from and how to get it onto a node."""

    model_config = ConfigDict(frozen=True)

    transport: Transport
    path: str | None = None
    """The archive, layout directory or Dockerfile (absolute); None for a registry image."""
    reference: str | None = None
    """The registry reference; an OCI layout's tag; the image picked from a docker archive."""
    context: str | None = None
    """A Dockerfile's build context (absolute)."""

    def __str__(self) -> str:
        if self.transport == "docker":
            return self.reference or ""
        extra = self.context if self.transport == "dockerfile" else self.reference
        return f"{self.transport}:{self.path}" + (f":{extra}" if extra else "")

    def missing(self) -> str | None:
        """What of this image is not on this machine (a path), or None."""
        for path in (self.path, self.context):
            if path is not None and not os.path.exists(path):
                return f"image {str(self)!r}: no such file or directory: {path}"
        return None


def parse_image(text: str) -> ImageRef:
    """Parse an image reference (the module's syntax); a malformed one is one ConfigError line."""
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"empty image reference {text!r}; {_SYNTAX}")
    text = text.strip()
    transport, colon, rest = text.partition(":")
    if transport in _UNSUPPORTED and colon:
        raise ConfigError(f"image {text!r}: transport {transport!r} is not supported; {_SYNTAX}")
    if transport == "docker" and rest.startswith("//"):
        return _registry(rest[2:], text)
    if transport in ("docker-archive", "oci", "oci-archive", "dockerfile") and colon:
        path, _, extra = rest.partition(":")
        if not path:
            raise ConfigError(f"image {text!r}: {transport}: needs a path; {_SYNTAX}")
        absolute = os.path.abspath(os.path.expanduser(path))
        if transport == "dockerfile":
            if os.path.isdir(absolute):
                absolute = os.path.join(absolute, "Dockerfile")
            context = os.path.abspath(extra) if extra else os.path.dirname(absolute)
            return ImageRef(transport="dockerfile", path=absolute, context=context)
        if extra and transport == "docker-archive":
            _registry(extra, text)  # the same grammar: refused here, not at load time
        elif extra and not re.fullmatch(r"[\w][\w.:-]{0,127}", extra):
            raise ConfigError(f"image {text!r}: {extra!r} is not a valid tag; {_SYNTAX}")
        return ImageRef(transport=transport, path=absolute, reference=extra or None)
    return _registry(text, text)


def _registry(reference: str, text: str) -> ImageRef:
    if not _REFERENCE.fullmatch(reference):
        raise ConfigError(f"image {text!r} is not a valid image reference; {_SYNTAX}")
    return ImageRef(transport="docker", reference=reference)


_digests: dict[tuple[object, ...], str] = {}
"""File digests by (path, size, mtime, inode): an archive is hashed once per process."""


def _file_digest(path: str) -> str:
    info = os.stat(path)
    memo = (path, info.st_size, info.st_mtime_ns, info.st_ino)
    found = _digests.get(memo)
    if found is None:
        with open(path, "rb") as handle:
            found = _digests[memo] = hashlib.file_digest(handle, "sha256").hexdigest()
    return found


def _tree_digest(root: str, hasher: hashlib._Hash) -> None:
    """Every entry under ``root``: its relative path, type, mode bits and content (a file's
    digest, a link's target), in a fixed order."""
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files + [d for d in dirs if os.path.islink(os.path.join(folder, d))]):
            path = os.path.join(folder, name)
            info = os.lstat(path)
            hasher.update(os.path.relpath(path, root).encode() + b"\0")
            hasher.update(f"{stat.S_IFMT(info.st_mode)}:{stat.S_IMODE(info.st_mode)}\0".encode())
            if stat.S_ISLNK(info.st_mode):
                hasher.update(os.readlink(path).encode())
            elif stat.S_ISREG(info.st_mode):
                hasher.update(_file_digest(path).encode())
            hasher.update(b"\n")


def content_key(ref: ImageRef) -> str:
    """A hex SHA-256 of what the image is made of: an archive's bytes, a layout's
    ``index.json`` (which names its manifests by digest) and tag, a Dockerfile with its whole
    build context; for a registry image, its reference (a digest reference is content, a tag
    names whatever the node first got). Blocking; raises :class:`SandboxError` when a path is
    missing on this node."""
    hasher = hashlib.sha256(f"{ref.transport}\0{ref.reference or ''}\0".encode())
    try:
        if ref.transport in ("docker-archive", "oci-archive"):
            assert ref.path is not None
            hasher.update(_file_digest(ref.path).encode())
        elif ref.transport == "oci":
            assert ref.path is not None
            hasher.update(Path(ref.path, "index.json").read_bytes())
        elif ref.transport == "dockerfile":
            assert ref.path is not None and ref.context is not None
            hasher.update(Path(ref.path).read_bytes() + b"\0")
            if not os.path.isdir(ref.context):
                raise FileNotFoundError(f"no build context directory {ref.context}")
            _tree_digest(ref.context, hasher)
    except OSError as exc:
        raise SandboxError(f"image {str(ref)!r}: {exc}") from exc
    return hasher.hexdigest()
