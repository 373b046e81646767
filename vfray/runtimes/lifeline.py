"""The owner's lifeline: one watchdog process per owner process that, once the owner is gone (even
by SIGKILL, when no ``stop`` runs), kills every process the runtimes started for it and removes
their cgroups, work dirs and docker containers (:mod:`vfray.runtimes._reap`); and, at the first
box start in a process, a sweep that reaps what owners whose watchdog died too left behind.

Every boxed process carries ``VFRAY_OWNER_ID=<token>`` in its environment (inherited by its own
children, also those that left the process group), as it carries the box marker that ``stop``
sweeps by.

Why a watchdog and not ``PR_SET_PDEATHSIG`` on each child: a ``preexec_fn`` calling ``prctl``
makes CPython fork() instead of vfork(), 15-20x slower from a ~300 MB parent (37-50 vs 2.5 ms
per spawn here); ``setpriv --pdeathsig`` keeps vfork but adds an exec per spawn (+0.6-3.7 ms).
Both cover only the direct child (a bash harness's grandchildren outlive it; the owner's stray
sweep is dead with it), and the signal fires when the *thread* that forked the child exits, not
the process. The watchdog costs nothing per spawn, covers grandchildren and strays by marker, and
watches the owner *process*: it waits for EOF on a pipe whose write end only the owner holds, and
also checks that the owner's PID still runs with the same start time (a fork of the owner that
inherited the write end delays the EOF). The watchdog is not the owner's child: it forks off at
start (the owner waits for its PID line), because Ray kills an actor's direct children when the
actor exits and a SandboxHost's boxes were left behind with their watchdog. The owner sees the
watchdog's death as EOF on a second pipe, whose write end only the watchdog holds.
The owner tells it, on the same pipe, where its work dirs live and which docker engines it uses.
Work dirs and cgroups carry the token in their names, containers in a label; an owner holds a
``flock`` on ``<tmp>/vfray-owners/<token>`` for its whole life, so a sweep tells dead owners
from live ones (and never touches an owner it cannot tell: no lock file). The lines told to the
watchdog are appended to that file too, so a sweep from another root reaps the owner's roots.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import fcntl
import json
import logging
import os
import select
import subprocess
import sys
import tempfile
import threading
import uuid

import vfray.runtimes._reap as _reap
from vfray.runtimes._executor import runtime_executor

OWNER_ENV = _reap.OWNER_ENV
OWNER_LABEL = _reap.OWNER_LABEL
HOST_LABEL = _reap.HOST_LABEL

logger = logging.getLogger(__name__)


def owners_dir() -> str:
    """Where owners keep their lock files."""
    return os.path.join(tempfile.gettempdir(), "vfray-owners")


class _Lifeline:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pid = -1
        self.token = ""
        self.write_fd = -1
        self.lock_fd = -1
        self.watchdog_pid: int | None = None
        self.alive_fd = -1
        """The read end of a pipe only the watchdog writes to (its PID, once): EOF when it died."""
        self.watched: list[str] = []
        """The ``root PATH`` / ``docker URL`` lines told to the watchdog (again after a restart)."""
        self.sweeps: dict[tuple[str, ...], concurrent.futures.Future[None]] = {}


_lifeline = _Lifeline()


def _take_lock(token: str) -> int:
    """Create and lock ``owners_dir()/token``; the lock lives as long as this process."""
    directory = owners_dir()
    if not os.path.isdir(directory):
        os.makedirs(directory, exist_ok=True)
        with contextlib.suppress(OSError):  # shared by every user, like /tmp
            os.chmod(directory, 0o1777)
    staging = os.path.join(directory, f".{token}.tmp")
    fd = os.open(staging, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    # Locked before it has its name: a sweep never sees an unlocked file of a live owner.
    os.rename(staging, os.path.join(directory, token))
    return fd


def owner_id() -> str | None:
    """This process's owner token, (re)starting its watchdog when needed: on first use, in a
    forked child (a new owner), or after the watchdog died. None where there is no /proc."""
    if not sys.platform.startswith("linux"):
        return None
    life = _lifeline
    with life.lock:
        pid = os.getpid()
        if life.pid != pid:
            # A fork of an owner is an owner of its own; its copy of the parent's write end is
            # left open (closing it changes nothing: the parent still holds one). Its copy of
            # the parent's lock is closed, so the parent's death is seen while the child lives.
            if life.lock_fd >= 0:
                os.close(life.lock_fd)
            life.pid, life.token, life.write_fd, life.watchdog_pid = pid, uuid.uuid4().hex, -1, None
            life.lock_fd, life.watched, life.sweeps = _take_lock(life.token), [], {}
            if life.alive_fd >= 0:  # the parent's watchdog's: nothing to this process
                os.close(life.alive_fd)
            life.alive_fd = -1
        if _watchdog_alive(life):
            return life.token
        for fd in (life.write_fd, life.alive_fd):
            if fd >= 0:
                os.close(fd)
        life.write_fd = life.alive_fd = -1
        life.watchdog_pid = None
        read_fd, life.write_fd = os.pipe()  # not inheritable: boxed programs never hold it
        life.alive_fd, alive_write = os.pipe()
        try:
            # The same token after a restart, so the boxes started so far stay covered. Its
            # own session: a signal to the owner's process group must not take it down too.
            starter = subprocess.Popen(
                [
                    sys.executable,
                    *("-I", "-S", _reap.__file__),
                    *(life.token, str(read_fd), str(pid), owners_dir(), str(alive_write)),
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                pass_fds=(read_fd, alive_write),
                start_new_session=True,
                # None of the owner's secrets; the mark that spares it when an owner above
                # its own (a Ray worker's driver) is reaped, so that it reaps its owner's boxes.
                env={_reap.WATCHDOG_ENV: life.token},
                cwd="/",
            )
        finally:
            os.close(read_fd)
            os.close(alive_write)
        # It forks off and exits: the watchdog is not this process's child (see _reap.detach).
        starter.wait()
        life.watchdog_pid = _read_pid(life.alive_fd)
        for line in life.watched:
            os.write(life.write_fd, line.encode())
        return life.token


def _read_pid(fd: int) -> int | None:
    """The watchdog's PID line, waited for (None when it died first: the next call starts
    another; or when it is this slow to start: :func:`_watchdog_alive` takes the line later)."""
    data = b""
    while not data.endswith(b"\n") and _readable(fd, 30.0):
        chunk = os.read(fd, 64)
        if not chunk:
            break
        data += chunk
    return int(data) if data.endswith(b"\n") else None


def _readable(fd: int, timeout: float) -> bool:
    """Whether ``fd`` has data or EOF within ``timeout`` seconds (poll: a busy owner's fds pass
    select's limit of 1024)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(timeout * 1000))


def _watchdog_alive(life: _Lifeline) -> bool:
    """Whether this process's watchdog runs: nothing to read on its pipe, or its late PID line
    (never EOF, which is its death)."""
    if life.alive_fd < 0:
        return False
    if not _readable(life.alive_fd, 0.0):
        return True
    line = os.read(life.alive_fd, 64)  # readable: this does not block
    if not line:
        return False
    if line.strip().isdigit():
        life.watchdog_pid = int(line)
    return True


def _tell(line: str) -> None:
    life = _lifeline
    if owner_id() is None:
        return
    with life.lock:
        if line in life.watched:
            return
        life.watched.append(line)
        # The lock file lists it too: a sweeper from another root reaps it all (see _reap).
        with contextlib.suppress(OSError):
            os.write(life.lock_fd, line.encode())
        with contextlib.suppress(OSError):  # a dead watchdog: owner_id() restarts it
            os.write(life.write_fd, line.encode())


def watch_root(path: str | None) -> str:
    """Tell the watchdog that work dirs are made in ``path`` (default: the temp dir);
    returns the directory."""
    root = os.path.abspath(path or tempfile.gettempdir())
    _tell(f"root {root}\n")
    return root


def watch_docker(url: str) -> None:
    """Tell the watchdog that containers are started on the engine at ``url``."""
    _tell(f"docker {url}\n")


def watch_podman(argv: list[str], env: dict[str, str]) -> str:
    """Tell the watchdog that containers are started in the podman store that ``argv`` (the
    podman command) with ``env`` reaches; returns that store's engine address for the sweep."""
    value = json.dumps({"argv": argv, "env": env}, sort_keys=True, separators=(",", ":"))
    _tell(f"podman {value}\n")
    return f"{_reap.PODMAN_PREFIX}{value}"


def work_dir_prefix(kind: str, owner: str | None) -> str:
    """The name prefix of a box's work dir, which the reaper reads the owner from."""
    return f"vfray-{kind}-{owner}-" if owner else f"vfray-{kind}-"


async def reap_dead_owners(root: str, docker_url: str | None = None) -> None:
    """Once per process, root and engine: reap what dead owners left there (and their
    processes and cgroups). Runs in the runtimes' pool; a failure is logged, never raised."""
    key = (root, docker_url or "")
    life = _lifeline
    with life.lock:
        future = life.sweeps.get(key)
        if future is None:
            urls = [docker_url] if docker_url else []
            future = life.sweeps[key] = runtime_executor().submit(_sweep, root, urls)
    await asyncio.wrap_future(future)


def _sweep(root: str, urls: list[str]) -> None:
    try:
        reaped = _reap.sweep_dead(owners_dir(), [root], urls)
    except Exception as exc:  # a sweep is housekeeping: never fail a box for it
        logger.warning("could not sweep what dead vfray processes left in %s: %s", root, exc)
        return
    if reaped:
        logger.info("reaped what %d dead vfray owner(s) left in %s", len(reaped), root)
