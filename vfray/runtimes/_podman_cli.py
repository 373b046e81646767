"""The podman CLI as the podman runtime drives it: podman's own environment, its calls with
their output, the ``--ulimit`` every container and build gets, a box's limits (rootless on
cgroup v1 too), and a live ``podman exec -i`` stopped through its processes in the container."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import signal
from collections.abc import Sequence

from vfray.runtimes._docker_exec import signal_exec
from vfray.runtimes._executor import blocking
from vfray.runtimes.base import RuntimeSpec
from vfray.runtimes.live import LocalProcess

PODMAN_ENV = (
    "PATH", "HOME", "USER", "LOGNAME", "TMPDIR", "XDG_RUNTIME_DIR", "XDG_CONFIG_HOME",
    "XDG_DATA_HOME", "CONTAINERS_CONF", "CONTAINERS_STORAGE_CONF", "CONTAINERS_REGISTRIES_CONF",
    "REGISTRY_AUTH_FILE", "DBUS_SESSION_BUS_ADDRESS", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY",
    "http_proxy", "https_proxy", "no_proxy",
)  # fmt: skip
"""What podman itself reads from its environment (its store, config, rootless runtime dir):
passed to every podman command, and never set from a box's environment."""
NOFILE_CAP = 1048576
NPROC_CAP = 32768
"""Podman 4.3 (root) lowers its own RLIMIT_NPROC to this before starting containers."""
_STOP_KILL_TRIES = 30
_WARNED_V1 = False
log = logging.getLogger(__name__)


def ulimit_args() -> list[str]:
    """``--ulimit`` for nofile and nproc at this process's hard limits (capped): podman's
    defaults exceed them where the hard limits are low, and ``podman run`` then fails."""
    args = []
    for name, which, cap in (
        ("nofile", resource.RLIMIT_NOFILE, NOFILE_CAP),
        ("nproc", resource.RLIMIT_NPROC, NPROC_CAP),
    ):
        hard = resource.getrlimit(which)[1]
        value = cap if hard == resource.RLIM_INFINITY else min(hard, cap)
        args += ["--ulimit", f"{name}={value}:{value}"]
    return args


def rootless_v1() -> bool:
    """Whether podman runs rootless (this process is not root) on cgroup v1, where it ignores
    ``--cpus``, ``--memory`` and ``--pids-limit`` (measured with podman 4.3: the container
    starts, with no limit in its cgroup): a rootless user may own no v1 cgroup."""
    return os.geteuid() != 0 and not os.path.exists("/sys/fs/cgroup/cgroup.controllers")


def limit_args(spec: RuntimeSpec) -> list[str]:
    """The box's cpus, memory (no swap past it) and pids as ``podman run`` arguments.

    Rootless on cgroup v1, where podman drops cgroup limits, memory becomes each program's data
    limit (RLIMIT_DATA: its writable private memory; podman's ``--ulimit`` has no ``as``, and
    address space would count what V8 and Go only reserve); cpus and pids stay advisory
    (RLIMIT_NPROC would count every box of the user: one user namespace holds them all)."""
    global _WARNED_V1
    if not rootless_v1():
        args = ["--cpus", f"{spec.cpu:g}"] if spec.cpu > 0 else []
        if spec.memory_gb is not None:
            megabytes = f"{int(spec.memory_gb * 1024)}m"
            args += ["--memory", megabytes, "--memory-swap", megabytes]
        return args + (["--pids-limit", str(spec.pids)] if spec.pids is not None else [])
    if not _WARNED_V1 and (spec.cpu > 0 or spec.pids is not None):
        _WARNED_V1 = True
        log.warning(
            "podman runtime: rootless on cgroup v1 cannot limit a box's cpus or pids (advisory "
            "here); memory is a per-program data limit (RLIMIT_DATA)"
        )
    if spec.memory_gb is None:
        return []
    limit = int(spec.memory_gb * 1024**3)
    return ["--ulimit", f"data={limit}:{limit}"]


class PodmanExecProcess(LocalProcess):
    """A live ``podman exec -i``: the client's pipes are the program's; ``stop`` signals the
    program's processes in the container (found by their exec marker), then the client."""

    def __init__(self, proc: asyncio.subprocess.Process, token: str) -> None:
        super().__init__(proc)
        self._token = token

    async def _stop(self, grace: float) -> int:
        exited = self._exit_future()
        if not exited.done() and await blocking(signal_exec, self._token, signal.SIGTERM):
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(exited), grace)
        for _ in range(_STOP_KILL_TRIES):
            if exited.done() or not await blocking(signal_exec, self._token, signal.SIGKILL):
                break
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(exited), 1.0)
        if not exited.done():
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()
        self.stdin.close()
        return await exited


def client_env() -> dict[str, str]:
    """podman's own environment: :data:`PODMAN_ENV` from this process's."""
    env = {k: os.environ[k] for k in PODMAN_ENV if k in os.environ}
    env.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    return env


async def podman_call(
    command: Sequence[str], args: Sequence[str], *, stdin: bytes | None, timeout: float
) -> tuple[int, bytes, bytes]:
    """Run ``command`` (podman with its global flags) with ``args``: exit code, stdout, stderr;
    killed when it runs past ``timeout`` or the call is cancelled."""
    proc = await asyncio.create_subprocess_exec(
        *command,
        *args,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=client_env(),
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(stdin), timeout)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise
    return proc.returncode or 0, out, err
