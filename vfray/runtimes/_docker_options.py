"""A docker container's options for ``client.containers.run``: its mounts (bridge dir, volumes,
the node's tool dir and interpreter), limits (cpus, memory without swap, pids, disk, GPUs),
dropped capabilities, user and network."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vfray.errors import ConfigError
from vfray.runtimes._bwrap_args import BRIDGE_DIR
from vfray.runtimes.base import RuntimeSpec
from vfray.runtimes.processes import MARKER_ENV
from vfray.runtimes.provision import tools_root
from vfray.task import TaskResources


def gpu_requests(gpu: str | None) -> list[Any] | None:
    """The device request giving a container the task's GPUs (``"A100:2"``: two; the type is
    where the farm places the rollout, not something the engine selects), or None for none."""
    count = TaskResources(gpu=gpu).gpu_count if gpu else 0
    if not count:
        return None
    from docker.types import DeviceRequest

    return [DeviceRequest(count=max(1, int(count)), capabilities=[["gpu"]])]


def node_python_root() -> str | None:
    """The installation of the node's interpreter (the one that makes the PyPI agents' venvs,
    :mod:`vfray.runtimes.provision`), when it lives outside ``/usr``: mounting ``/usr`` would
    hide the image's own programs. None for a system Python."""
    root = os.path.realpath(sys.base_prefix)
    if root in ("/", "/usr") or root.startswith(("/usr/", "/etc/")) or not os.path.isdir(root):
        return None
    return root


def numeric_user(user: str) -> tuple[int, int]:
    uid, _, gid = user.partition(":")
    if not uid.isdigit() or not (gid or uid).isdigit():
        raise ConfigError(f"docker runtime: user must be 'uid' or 'uid:gid' (numbers): {user!r}")
    return int(uid), int(gid or uid)


def container_options(
    spec: RuntimeSpec,
    base: Path,
    host_volumes: Mapping[str, str],
    *,
    box_id: str,
    box_workdir: str,
    labels: dict[str, str],
    disk: dict[str, str] | None,
    user: str | None,
    shared_network: bool,
) -> dict[str, Any]:
    """The options of a box with its private dirs under ``base``, ``host_volumes`` mounted
    read-only (host path -> container path), ``disk`` as ``storage_opt``."""
    volumes: dict[str, dict[str, str]] = {str(base / "bridge"): {"bind": BRIDGE_DIR, "mode": "rw"}}
    for host, inside in host_volumes.items():
        volumes[host] = {"bind": inside, "mode": "ro"}
    # The node's agent tool dir (vfray.runtimes.provision), read-only at its own path as in
    # bwrap:
    # agent harnesses run their programs from it. Its programs need what they link to
    # (glibc for node; a Python agent's venv, its interpreter's path).
    tools = str(tools_root())
    if os.path.isdir(tools) and tools not in volumes:
        volumes[tools] = {"bind": tools, "mode": "ro"}
        # A PyPI agent's venv runs the node's interpreter, named by its path: mounted there
        # too, so a task's image (its own python3 untouched) runs it as bwrap does.
        python = node_python_root()
        if python is not None and python not in volumes:
            volumes[python] = {"bind": python, "mode": "ro"}
    options: dict[str, Any] = {
        "entrypoint": ["sleep"],
        "command": ["infinity"],
        "detach": True,
        "working_dir": box_workdir,
        "labels": labels,
        "environment": {MARKER_ENV: box_id, "HOME": box_workdir},
        "volumes": volumes,
        "nano_cpus": int(spec.cpu * 1e9) if spec.cpu > 0 else None,
        "mem_limit": (f"{int(spec.memory_gb * 1024)}m" if spec.memory_gb is not None else None),
        # No swap past the limit: a program over it is killed, as in a bwrap box.
        "memswap_limit": (f"{int(spec.memory_gb * 1024)}m" if spec.memory_gb is not None else None),
        "pids_limit": spec.pids,
        "storage_opt": disk,
        "device_requests": gpu_requests(spec.gpu),
        # Root in the container has no capabilities (Docker's default set includes chown,
        # setuid, net_raw, mknod…) and nothing gains privileges through setuid binaries.
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        # None: the image's own USER (root when the image names none).
        "user": user,
    }
    if not shared_network:
        options["network_mode"] = "none"
    return {k: v for k, v in options.items() if v is not None}
