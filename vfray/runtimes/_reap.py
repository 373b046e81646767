"""Reaping what a dead owner left: its processes, bwrap cgroups, work dirs (and the overlay mounts
of image boxes in them) and docker containers, found by the owner token in their environment,
name or label (docker's engine API, or the podman CLI). Stdlib only: the lifeline watchdog
runs this file as ``python -I -S _reap.py TOKEN FD OWNER_PID OWNERS_DIR [ALIVE_FD]``; given
``ALIVE_FD``, it forks off (the process the owner started exits at once) and writes its PID there.

An owner is dead when its lock file ``OWNERS_DIR/TOKEN`` exists and nobody holds its ``flock``
(the kernel drops the lock with the owner's last fd, even on SIGKILL). No lock file: unknown
(e.g. an owner from an older vfray), never touched.

The lock file is also the owner's manifest: the ``root PATH`` / ``docker URL`` lines it tells its
watchdog are appended to it too. A sweeper reaps those places as well as its own, so it may
remove the lock file after: an owner whose boxes lived under another root than the sweeper's is
not left unknown (its lock gone, its dirs kept) to the sweeper that does share its root.
"""

from __future__ import annotations

import contextlib
import fcntl
import http.client
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterable

OWNER_ENV = "VFRAY_OWNER_ID"
WATCHDOG_ENV = "VFRAY_WATCHDOG_OF"
"""In a watchdog's environment: the token it watches. Reaping an owner spares the watchdogs
below it: a Ray worker carries its driver's token, and the driver's watchdog killed each
SandboxHost's own watchdog with it, leaving the host's work dirs, cgroups and containers."""
OWNER_LABEL = "vfray.owner"
HOST_LABEL = "vfray.host"
PODMAN_PREFIX = "podman:"
"""Engines that are podman stores: ``podman:{"argv": [...], "env": {...}}`` (no daemon to
address: the command and environment that reach the store), from ``podman JSON`` lines."""
CGROUP_ROOT = "/sys/fs/cgroup"
_TOKEN = "[0-9a-f]{32}"
DIR_NAME = re.compile(rf"^vfray-.+?-({_TOKEN})-")
"""Work dirs: ``vfray-<runtime>-<token>-<random>``."""
CGROUP_NAME = re.compile(rf"^vfray-({_TOKEN})-")
"""bwrap cgroups: ``vfray-<token>-<box id>`` in each v1 controller."""
SNAPSHOT_S = 2.0
"""How often the watchdog notes the owner's process tree while the owner lives."""
LOCK_GRACE_S = 5.0
"""How long the watchdog waits, after reaping, for a dead owner's lock to be dropped."""


def lock_dead(owners_dir: str, token: str) -> int | None:
    """An fd holding the dead owner's lock, or None when it is alive or unknown."""
    try:
        fd = os.open(os.path.join(owners_dir, token), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def manifest(fd: int) -> tuple[set[str], set[str]]:
    """The roots and docker engines a (locked) owner's lock file lists."""
    roots: set[str] = set()
    urls: set[str] = set()
    data = b""
    with contextlib.suppress(OSError):
        while chunk := os.pread(fd, 65536, len(data)):
            data += chunk
    for line in data.decode(errors="replace").splitlines():
        add_line(line, roots, urls)
    return roots, urls


def add_line(line: str, roots: set[str], urls: set[str]) -> None:
    """One ``root PATH`` / ``docker URL`` line of an owner's manifest (its lock file, or the
    pipe to its watchdog) into ``roots`` / ``urls``; anything else is ignored."""
    kind, _, value = line.partition(" ")
    if value:
        if kind == "podman":  # a podman store: engines are addressed by what reaches them
            value = f"{PODMAN_PREFIX}{value}"
        (roots if kind == "root" else urls if kind in ("docker", "podman") else set()).add(value)


def env_pids(name: str) -> dict[str, list[int]]:
    """Value of the environment variable ``name`` -> PIDs of the live processes carrying it,
    this process left out; one walk of /proc. The one scanner of process environments in vfray
    (owners here, boxes' stray markers, docker execs, a local Ray start's token), kept in this
    stdlib-only file so the watchdog script has it too. A process that is mid-exec shows an
    empty environment for a moment: callers that must not miss one scan again."""
    needle = f"{name}=".encode()
    found: dict[str, list[int]] = {}
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                environ = fh.read()
        except OSError:
            continue
        if needle not in environ:
            continue
        for item in environ.split(b"\0"):
            if item.startswith(needle):
                value = item[len(needle) :].decode(errors="replace")
                found.setdefault(value, []).append(int(entry))
    return found


def _with_descendants(pids: Iterable[int]) -> list[int]:
    """``pids`` and every process below them, read from /proc before any is killed (a killed
    parent's children are reparented, and a child whose environment was rewritten, e.g. by
    ``setproctitle`` in Ray's agents, is still found through its parent). Other owners'
    watchdogs are left out: each reaps its own owner once that owner is killed here."""
    spare = {pid for found in env_pids(WATCHDOG_ENV).values() for pid in found}
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: the ppid follows its last ")".
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(int(name))
    found, todo, me = set(), list(pids), os.getpid()
    while todo:
        pid = todo.pop()
        if pid in found or pid == me or pid in spare:
            continue
        found.add(pid)
        todo.extend(children.get(pid, ()))
    return sorted(found)


def _stat(pid: int) -> list[bytes]:
    """The fields of ``/proc/PID/stat`` after the command name (state first); [] when gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return []
    return stat[stat.rfind(b")") + 2 :].split()


def _start_time(pid: int) -> str | None:
    """The process's start time (clock ticks since boot): with the PID, its identity."""
    fields = _stat(pid)
    return fields[19].decode() if len(fields) > 19 else None


def snapshot(token: str) -> dict[int, str]:
    """The processes carrying the token and everything below them, by PID -> start time.

    Taken while the owner lives: a process whose environment was rewritten (Ray's agents set
    their title over it) is found only through its parent, and that parent may die before the
    owner's reaping (Ray's raylet goes with its driver), leaving the child reparented and
    unmarked. A PID is killed from the snapshot only while its start time still matches."""
    marked = env_pids(OWNER_ENV).get(token, [])
    found = {}
    for pid in _with_descendants(marked) if marked else []:
        started = _start_time(pid)
        if started is not None:
            found[pid] = started
    return found


def kill_processes(token: str, known: dict[int, str] | None = None) -> None:
    """SIGKILL the ``known`` processes (a :func:`snapshot`) that are still the same, then every
    process carrying the token and everything below them, until three walks in a row find none
    (one may be mid-fork), for at most a minute. A watchdog is never killed from the snapshot:
    one caught between its fork and its exec still showed its owner's environment then (the
    token above it, not its own mark), and killing it would leave its owner's boxes behind."""
    spare = {pid for found in env_pids(WATCHDOG_ENV).values() for pid in found}
    for pid, started in (known or {}).items():
        if pid not in spare and _start_time(pid) == started:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    quiet, deadline = 0, time.monotonic() + 60
    while quiet < 3 and time.monotonic() < deadline:
        marked = env_pids(OWNER_ENV).get(token, [])
        pids = _with_descendants(marked) if marked else []
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        quiet = 0 if pids else quiet + 1
        time.sleep(0.02)


def _cgroups() -> list[tuple[str, str]]:
    """(token, path) of every vfray cgroup on this host."""
    found = []
    with contextlib.suppress(OSError):
        for controller in os.listdir(CGROUP_ROOT):
            top = os.path.join(CGROUP_ROOT, controller)
            with contextlib.suppress(OSError):
                for name in os.listdir(top):
                    match = CGROUP_NAME.match(name)
                    if match:
                        found.append((match.group(1), os.path.join(top, name)))
    return found


def remove_cgroups(token: str) -> None:
    for owner, path in _cgroups():
        if owner != token:
            continue
        for _ in range(200):
            try:
                with open(os.path.join(path, "cgroup.procs")) as fh:
                    members = [int(p) for p in fh.read().split()]
            except OSError:
                break
            for pid in members:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            try:
                os.rmdir(path)
                break
            except OSError:
                time.sleep(0.01)  # a killed member leaves once the kernel has torn it down


def _dirs(roots: Iterable[str]) -> list[tuple[str, str]]:
    found = []
    for root in roots:
        with contextlib.suppress(OSError), os.scandir(root) as entries:
            for entry in entries:
                match = DIR_NAME.match(entry.name)
                if match and entry.is_dir(follow_symlinks=False):
                    found.append((match.group(1), entry.path))
    return found


def mount_points_under(path: str) -> list[str]:
    """Mount points at or below ``path`` in this mount namespace, deepest first."""
    path = os.path.realpath(path)
    found = []
    with contextlib.suppress(OSError), open("/proc/self/mountinfo", "rb") as fh:
        for line in fh:
            fields = line.split()
            if len(fields) < 5:
                continue
            # Octal escapes for space, tab, newline and backslash in the mount point.
            point = re.sub(
                rb"\\([0-7]{3})", lambda m: bytes([int(m.group(1), 8)]), fields[4]
            ).decode(errors="surrogateescape")
            if point == path or point.startswith(path.rstrip("/") + "/"):
                found.append(point)
    return sorted(set(found), key=lambda p: (-p.count("/"), p))


def unmount_under(path: str) -> None:
    """Detach every mount at or below ``path`` (a box's overlay root): ``umount2(MNT_DETACH)``,
    or ``fusermount -u -z`` for a fuse mount this unprivileged user made. Before a box dir is
    removed: removing through a live overlay would only write whiteouts."""
    import ctypes  # here: the watchdog imports this file at start, and rarely needs it
    import ctypes.util

    points = mount_points_under(path)
    if not points:
        return
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    for point in points:
        if libc.umount2(point.encode(errors="surrogateescape"), 2) == 0:  # MNT_DETACH
            continue
        for fusermount in ("fusermount3", "fusermount"):
            found = shutil.which(fusermount, path="/usr/bin:/bin:/usr/local/bin")
            if found:
                with contextlib.suppress(OSError, subprocess.SubprocessError):
                    subprocess.run(
                        [found, "-u", "-z", point], capture_output=True, timeout=30, check=False
                    )
                break


def remove_dirs(token: str, roots: Iterable[str]) -> None:
    for owner, path in _dirs(roots):
        if owner == token:
            unmount_under(path)  # a box's overlay root, left mounted by a dead owner
            shutil.rmtree(path, ignore_errors=True)


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


def docker_request(url: str, method: str, path: str, timeout: float = 10.0) -> object:
    """One Docker Engine API call on ``unix://`` or ``tcp://`` (no TLS); the decoded JSON body,
    or None for an empty one. Raises OSError when the engine is unreachable or answers >= 400."""
    parts = urllib.parse.urlsplit(url)
    conn: http.client.HTTPConnection
    if parts.scheme in ("unix", "http+unix"):
        conn = _UnixConnection(parts.path, timeout)
    elif parts.scheme in ("tcp", "http"):
        conn = http.client.HTTPConnection(parts.hostname or "localhost", parts.port, timeout)
    else:
        raise OSError(f"unsupported docker host {url!r} (unix:// or tcp:// without TLS)")
    try:
        conn.request(method, path)
        response = conn.getresponse()
        body = response.read()
    except (http.client.HTTPException, ValueError) as exc:
        raise OSError(f"docker at {url}: {exc}") from exc
    finally:
        conn.close()
    if response.status >= 400:
        raise OSError(f"docker at {url}: HTTP {response.status} {body[:200]!r}")
    return json.loads(body) if body.strip() else None


def podman_command(engine: str) -> tuple[list[str], dict[str, str]]:
    """The podman command and environment a ``podman:{"argv": [...], "env": {...}}`` engine
    names (the store a podman runtime used: rootful, or a rootless user's)."""
    found = json.loads(engine[len(PODMAN_PREFIX) :])
    return [str(a) for a in found["argv"]], {str(k): str(v) for k, v in found["env"].items()}


def _podman_request(engine: str, args: list[str]) -> str:
    argv, env = podman_command(engine)
    try:
        done = subprocess.run([*argv, *args], capture_output=True, text=True, env=env,
                              timeout=120, check=False)  # fmt: skip
    except (subprocess.SubprocessError, ValueError) as exc:
        raise OSError(f"podman: {exc}") from exc
    if done.returncode:
        raise OSError(f"podman {args[0]}: {done.stderr.strip()[:200]}")
    return done.stdout


def _containers(url: str, label: str) -> list[dict[str, object]]:
    if url.startswith(PODMAN_PREFIX):
        out = _podman_request(url, ["ps", "-a", "--filter", f"label={label}", "--format", "json"])
        try:
            listed = json.loads(out or "[]")
        except ValueError as exc:
            raise OSError(f"podman ps: {exc}") from exc
        return [c for c in listed if isinstance(c, dict)] if isinstance(listed, list) else []
    filters = urllib.parse.quote(json.dumps({"label": [label]}))
    listed = docker_request(url, "GET", f"/containers/json?all=1&filters={filters}")
    return [c for c in listed if isinstance(c, dict)] if isinstance(listed, list) else []


def remove_containers(token: str, urls: Iterable[str]) -> None:
    for url in urls:
        with contextlib.suppress(OSError):
            for container in _containers(url, f"{OWNER_LABEL}={token}"):
                with contextlib.suppress(OSError):
                    if url.startswith(PODMAN_PREFIX):
                        _podman_request(url, ["rm", "-f", "-t", "0", str(container["Id"])])
                        continue
                    docker_request(url, "DELETE", f"/containers/{container['Id']}?force=1&v=1")


def reap(
    token: str,
    owners_dir: str,
    roots: Iterable[str],
    urls: Iterable[str],
    *,
    unlock: bool,
    known: dict[int, str] | None = None,
) -> None:
    """Remove everything the (dead) owner ``token`` left, then (``unlock``) its lock file.
    Processes first: a cgroup can be removed only once empty, a dir is refilled while a writer
    lives."""
    kill_processes(token, known)
    remove_cgroups(token)
    remove_containers(token, urls)
    remove_dirs(token, roots)
    if unlock:
        remove_lock(owners_dir, token)


def remove_lock(owners_dir: str, token: str) -> None:
    """Remove a dead owner's lock file, last, once all it left is reaped."""
    with contextlib.suppress(OSError):
        os.unlink(os.path.join(owners_dir, token))


def sweep_dead(owners_dir: str, roots: Iterable[str], urls: Iterable[str] = ()) -> list[str]:
    """Reap every dead owner that left something in ``roots``, the cgroups, the engines at
    ``urls`` (containers labelled with this host's name) or the process table; returns their
    tokens. Owners that are alive or unknown are left alone."""
    roots, urls = list(roots), list(urls)
    tokens = {token for token, _ in _dirs(roots)} | {token for token, _ in _cgroups()}
    tokens |= set(env_pids(OWNER_ENV))
    with contextlib.suppress(OSError):
        tokens |= {name for name in os.listdir(owners_dir) if re.fullmatch(_TOKEN, name)}
    host = socket.gethostname()
    for url in urls:
        with contextlib.suppress(OSError):
            for container in _containers(url, f"{HOST_LABEL}={host}"):
                labels = container.get("Labels")
                if isinstance(labels, dict) and isinstance(labels.get(OWNER_LABEL), str):
                    tokens.add(labels[OWNER_LABEL])
    reaped = []
    for token in sorted(tokens):
        fd = lock_dead(owners_dir, token)
        if fd is None:
            continue
        try:
            listed_roots, listed_urls = manifest(fd)
            reap(
                token,
                owners_dir,
                sorted({*roots, *listed_roots}),
                sorted({*urls, *listed_urls}),
                unlock=True,
            )
        finally:
            os.close(fd)
        reaped.append(token)
    return reaped


def _alive(pid: int, started: str | None) -> bool:
    """Whether the process ``pid`` that started at ``started`` still runs (a zombie does not)."""
    fields = _stat(pid)
    return len(fields) > 19 and fields[0] not in (b"Z", b"X") and fields[19].decode() == started


def detach(alive_fd: int) -> None:
    """Leave the owner's process tree: fork, the parent (the owner's child) exits, and the
    child, reparented to init (or the nearest subreaper), writes its PID on ``alive_fd`` and
    keeps it open for life, so the owner sees the watchdog's death as EOF there.

    Why: Ray kills an actor's *direct* children when the actor exits
    (``RAY_kill_child_processes_on_worker_exit``, on by default), and a SandboxHost's watchdog
    was one of them: a host that exited with boxes running (``ray.shutdown()`` with no farm
    close, or a close past its deadline) left their dirs, cgroups and network namespaces to the
    next box start on the node. A double fork is how Ray's own docs say to outlive the worker."""
    if os.fork() > 0:
        os._exit(0)
    os.write(alive_fd, f"{os.getpid()}\n".encode())


def watch(token: str, fd: int, owner: int, owners_dir: str, alive_fd: int | None = None) -> None:
    """The watchdog: read ``root PATH`` / ``docker URL`` lines from the owner's pipe until EOF
    (or until the owner process is gone while a fork of it holds the pipe), then reap what the
    owner left. Given ``alive_fd``, it first leaves the owner's tree (:func:`detach`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Read while the owner waits for this watchdog: the owner's identity is its PID and start
    # time (a detached watchdog is not its child, so its parent PID tells nothing). Already gone
    # (None): reap now.
    started = _start_time(owner)
    if alive_fd is not None:
        detach(alive_fd)
    roots: set[str] = set()
    urls: set[str] = set()
    pending = b""
    known: dict[int, str] = {}
    next_snapshot = time.monotonic()
    poller = select.poll()  # not select(): the owner's fd numbers, kept here, may pass 1024
    poller.register(fd, select.POLLIN)
    while True:
        if time.monotonic() >= next_snapshot:
            # A walk of /proc costs a few ms: every SNAPSHOT_S is nothing next to a rollout.
            known = snapshot(token)
            next_snapshot = time.monotonic() + SNAPSHOT_S
        # The owner's death shows as EOF, or as its process gone when a fork of it holds the
        # pipe; the lines it wrote before dying are read either way.
        gone = not _alive(owner, started)
        readable = poller.poll(0 if gone else 1000)
        if not readable:
            if gone:
                break
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            add_line(line.decode(errors="replace"), roots, urls)
    held = lock_dead(owners_dir, token)
    try:
        reap(token, owners_dir, roots, urls, unlock=False, known=known)
        # The pipe's EOF can come before the kernel drops the dying owner's lock: in 1 of ~20
        # SIGKILLed owners the lock was still held at EOF and free 90 ms later, once all was
        # reaped. So ask again for a moment; still held, a fork of the owner has it, and the
        # lock file is left for the sweep that runs once that fork is gone too.
        deadline = time.monotonic() + LOCK_GRACE_S
        while held is None and time.monotonic() < deadline:
            time.sleep(0.05)
            held = lock_dead(owners_dir, token)
        if held is not None:
            remove_lock(owners_dir, token)
    finally:
        if held is not None:
            os.close(held)


if __name__ == "__main__":
    watch(
        sys.argv[1],
        int(sys.argv[2]),
        int(sys.argv[3]),
        sys.argv[4],
        int(sys.argv[5]) if len(sys.argv) > 5 else None,
    )
