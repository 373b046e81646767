"""Internal: the trust policy given to skopeo and podman for images read from local files.

Tools built on containers/image refuse to copy any image without a trust policy
(``$HOME/.config/containers/policy.json`` or ``/etc/containers/policy.json``, which Debian ships
in ``golang-github-containers-common``). A node without one (a package setup cut off before it
was configured leaves the file as ``policy.json.dpkg-new``; a skopeo binary installed on its
own brings none) failed every task image with "Error loading trust policy". An image read from
a file (an OCI layout or archive, a docker archive, an engine's export) has no signature to
check, so where the node has no policy of its own such a read is given one that accepts those
local transports and rejects every other: what Debian's default policy (accept anything) would
let through for them, and nothing more. A registry image is pulled under the node's own policy,
or refused by the tool with its own message where there is none.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

LOCAL_TRANSPORTS = ("oci", "oci-archive", "docker-archive", "dir")
"""Transports that read an image from the node's files: no signature to check."""
SYSTEM_POLICY = Path("/etc/containers/policy.json")
POLICY_NAME = "vfray-local-images-policy.json"
_POLICY = {
    "default": [{"type": "reject"}],
    "transports": {t: {"": [{"type": "insecureAcceptAnything"}]} for t in LOCAL_TRANSPORTS},
}


def node_policy(home: str | None = None) -> Path | None:
    """The trust policy the tools would load (the user's, then the system's), or None."""
    home = home if home is not None else os.environ.get("HOME")
    user = Path(home, ".config/containers/policy.json") if home else None
    for path in (user, SYSTEM_POLICY):
        if path is not None and path.is_file():
            return path
    return None


def local_policy_args(
    flag: str, transport: str, where: Path, *, home: str | None = None
) -> list[str]:
    """``[flag, FILE]`` for reading an image of ``transport`` when the node has no trust policy
    and the transport is a local one (the policy written as FILE in ``where``, a dir of the
    caller's that outlives the tool's run); else ``[]`` (the node's own policy applies)."""
    if transport not in LOCAL_TRANSPORTS or node_policy(home) is not None:
        return []
    where.mkdir(parents=True, exist_ok=True)
    path = where / POLICY_NAME
    # Renamed into place: another process's tool may be reading the same file (podman's is
    # shared by the node's pulls), and must never see it half written.
    partial = where / f".{POLICY_NAME}.{os.getpid()}.{threading.get_ident()}"
    try:
        partial.write_text(json.dumps(_POLICY))
        os.replace(partial, path)
    except OSError:
        partial.unlink(missing_ok=True)  # a full disk leaves no stray file behind
        raise
    return [flag, str(path)]
