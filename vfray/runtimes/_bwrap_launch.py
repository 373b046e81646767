"""How a bwrap box's command is launched: the host's check that boxes can run at all, and the
full argv and environment of one command (the box's cgroups joined and network namespace
entered first, then ``bwrap`` with the box's mounts, then the in-box forwarder when the box's
bridged ports or a live process's way in need one, then the program).

:class:`vfray.runtimes.bwrap.BwrapRuntime` holds the box's state and decides what applies; the
functions here only assemble it.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from vfray.errors import ConfigError, SandboxError
from vfray.runtimes._bwrap_args import BRIDGE_DIR, can_disable_userns, namespaces
from vfray.runtimes.bridge import BOX_FORWARDER
from vfray.runtimes.processes import box_env, network_env

logger = logging.getLogger(__name__)

HOST_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
"""``PATH`` in a box over the host's root, after the owner's interpreter's dir."""


def find_bwrap() -> str:
    """The path of ``bwrap``, or a :class:`SandboxError` saying how to install it."""
    bwrap = _which_bwrap(os.environ.get("PATH"))
    if bwrap is None:
        raise SandboxError("bubblewrap is not installed (apt-get install bubblewrap)")
    return bwrap


@functools.lru_cache(maxsize=8)
def _which_bwrap(path: str | None) -> str | None:
    # Looked up once per PATH, not per command: the walk of PATH (a stat per dir) was ~0.1 ms
    # of the owner's CPU per launch.
    return shutil.which("bwrap", path=path)


def preflight() -> None:
    """Run ``bwrap … true`` once with the boxes' namespaces and mounts of the host; a
    :class:`ConfigError` in one line when it cannot run."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise ConfigError("bwrap runtime: bubblewrap is not installed (apt-get install bubblewrap)")
    argv = [bwrap, *namespaces(), "--proc", "/proc", "--dev", "/dev", "--", "true"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"bwrap runtime: cannot run {bwrap}: {exc}") from exc
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        raise ConfigError(
            f"bwrap runtime: a test box failed ({why}); bubblewrap needs user namespaces "
            "(sysctl user.max_user_namespaces > 0, kernel.unprivileged_userns_clone=1 when "
            "not root; in a container: --security-opt seccomp=unconfined or --privileged)"
        )
    if not can_disable_userns():
        logger.warning(
            "bwrap runtime: this bubblewrap has no --disable-userns (0.8 or later has it): "
            "a box's programs can create nested user namespaces"
        )


def bwrap_args(
    prefix: Sequence[str],
    *,
    share_net: bool,
    cwd: str | None,
    box_workdir: str,
    nsswitch: Path | None,
) -> list[str]:
    """The box's bwrap arguments ``prefix`` (its namespaces and mounts) for one command: the
    host network (or the box's own namespace, entered before bwrap) kept with ``share_net``,
    its work dir ``cwd`` (relative: under ``box_workdir``), ``nsswitch`` over the box's
    ``/etc/nsswitch.conf`` (a box without network resolves names from files only)."""
    args = list(prefix)
    if share_net:
        args.insert(args.index("--unshare-all") + 1, "--share-net")
    if cwd:
        # bubblewrap keeps the last --chdir; a relative one is under the box's work dir.
        args += ["--chdir", str(Path(box_workdir, cwd))]
    if nsswitch is not None:
        args += ["--ro-bind", str(nsswitch), "/etc/nsswitch.conf"]
    return args


def forwarded(
    command: Sequence[str],
    python: Sequence[str],
    bridge_args: Sequence[str],
    serve: str | None,
) -> list[str]:
    """``command`` behind the in-box forwarder (:data:`BOX_FORWARDER`, run by ``python``),
    which listens on the bridged ports (``bridge_args``) and on the way in ``serve`` first."""
    ways_in = [f"@{BRIDGE_DIR}/{serve}"] if serve else []
    return [*python, "-I", "-S", "-c", BOX_FORWARDER, *bridge_args, *ways_in, "--", *command]


def host_path() -> str:
    """``PATH`` of a box over the host's root: the owner's interpreter's dir first."""
    return f"{os.path.dirname(sys.executable)}:{HOST_PATH}"


def command_env(
    path: str,
    image_env: Mapping[str, str],
    egress_env: Mapping[str, str],
    env: Mapping[str, str] | None,
    *,
    isolated: bool,
    box_workdir: str,
    box_id: str,
    owner: str | None,
) -> dict[str, str]:
    """The environment of one command: ``PATH``, the owner's locale and time zone, the box's
    own variables, then the image's, the way out (an ``isolated`` box's egress gate's
    ``egress_env``, else the owner's proxy settings) and ``env``, each over the ones before."""
    base_env = {"PATH": path}
    # By name: iterating os.environ decodes every variable of the owner's, per command.
    base_env.update({k: os.environ[k] for k in ("LANG", "LC_ALL", "TZ") if k in os.environ})
    way_out = egress_env if isolated else network_env(os.environ)
    extra = {**image_env, **way_out, **(env or {})}
    return box_env(base_env, box_workdir, box_id, extra, owner=owner)
