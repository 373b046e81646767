"""The bwrap argv of a box: its namespaces and user, the host's read-only system dirs and the
parts of ``/etc`` it sees, the host interpreter's paths, and the mounts of a box over the host's
root or over an image's copy-on-write root (:class:`vfray.runtimes.bwrap.BwrapRuntime`'s)."""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from vfray.errors import SandboxError
from vfray.runtimes._foreign_root import NodePrograms
from vfray.runtimes.provision import tools_root

BRIDGE_DIR = "/run/vfray-bridge"
_ROOT_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
BOX_UID = 65534
"""The uid and gid programs run as inside the box (``nobody``); the box's dirs are its own."""
ETC_ENTRIES = (
    "hosts", "resolv.conf", "nsswitch.conf", "host.conf", "gai.conf", "networks", "protocols",
    "services", "ssl", "ca-certificates", "ca-certificates.conf", "pki", "crypto-policies",
    "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "localtime", "timezone",
    "os-release", "debian_version", "mime.types", "magic", "inputrc", "bash.bashrc", "profile",
    "locale.alias", "terminfo", "python3", "python3.11", "python3.12", "python3.13",
)  # fmt: skip
"""What a box sees of the host's ``/etc``: name resolution, TLS roots, the dynamic loader,
Debian alternatives (``python3``, ``node``, ``editor``…), time zone and shell defaults. Never
shadow/gshadow/sudoers/ssh keys, nor pip.conf/npmrc/gitconfig (they may hold credentials);
``passwd``/``group`` are the box's own (root and the box user)."""

OFFLINE_NSSWITCH = "passwd: files\ngroup: files\nhosts: files\nnetworks: files\n"
"""``/etc/nsswitch.conf`` of a box without network: no DNS to wait for."""
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""``PATH`` in a box over an image: the image's own programs (its ``python3`` included)."""


@functools.cache
def can_disable_userns() -> bool:
    """Whether this bubblewrap has ``--disable-userns`` (0.8 and later)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return False
    try:
        done = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "--disable-userns" in done.stdout


def namespaces(host_root: bool = True, uid: int = BOX_UID, gid: int = BOX_UID) -> list[str]:
    """Namespaces and user (``uid``/``gid``, mapped to the node's user) of every box, and
    (``host_root``) the host's read-only system dirs."""
    # An unprivileged user with no capabilities: as uid 0 with the namespace's full
    # capability set, a box could read every root-only file bound into it.
    args = ["--die-with-parent", "--new-session", "--unshare-all", "--unshare-user"]
    if can_disable_userns():
        # No nested user namespace: one would hand a box's program a full capability set again
        # inside it (and the kernel's user-namespace code is a frequent escalation route).
        args.append("--disable-userns")
    args += ["--uid", str(uid), "--gid", str(gid), "--cap-drop", "ALL"]
    if not host_root:
        return args
    return args + system_binds()


def system_binds() -> list[str]:
    """The host's ``/usr`` and root-level system dirs, read-only (as links where they are)."""
    args = ["--ro-bind", "/usr", "/usr"]
    for d in _ROOT_DIRS:
        if os.path.islink(d):
            args += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            args += ["--ro-bind", d, d]
    return args


def _entries(text: str) -> list[list[str]]:
    return [line.split(":") for line in text.splitlines() if line.count(":") >= 2]


def user_ids(user: str, passwd: str, group: str) -> tuple[int, int] | None:
    """The uid and gid of ``user`` (``name``, ``uid``, either with ``:group``) by the box's
    ``/etc/passwd`` and ``/etc/group`` texts, as ``docker exec --user`` resolves them (a uid
    not in ``passwd`` has gid 0); None when a name is in neither."""
    name, _, group_name = user.partition(":")
    users = {e[0]: e for e in _entries(passwd)}
    by_uid = {e[2]: e for e in reversed(_entries(passwd))}
    if name.isdigit():
        uid, entry = int(name), by_uid.get(name)
    else:
        entry = users.get(name)
        if entry is None or not entry[2].isdigit():
            return None
        uid = int(entry[2])
    gid = int(entry[3]) if entry is not None and len(entry) > 3 and entry[3].isdigit() else 0
    if group_name:
        if group_name.isdigit():
            return uid, int(group_name)
        found = [e for e in _entries(group) if e[0] == group_name and e[2].isdigit()]
        if not found:
            return None
        gid = int(found[0][2])
    return uid, gid


def home_of(uid: int, passwd: str) -> str | None:
    """The home dir of ``uid`` by the box's ``/etc/passwd`` text; None when it has none."""
    homes = [e[5] for e in _entries(passwd) if len(e) > 5 and e[2] == str(uid) and e[5]]
    return homes[0] if homes else None


def read_user_ids(user: str, passwd: str, group: str) -> tuple[int, int]:
    """``user``'s ids (:func:`user_ids`) by the box's ``passwd`` and ``group`` files (an
    unreadable one read as empty); SandboxError when it has no such user."""
    texts = []
    for path in (passwd, group):
        try:
            texts.append(Path(path).read_text(errors="replace"))
        except OSError:
            texts.append("")
    ids = user_ids(user, *texts)
    if ids is None:
        raise SandboxError(f"bwrap box: no user {user!r} in the box's /etc/passwd (or group)")
    return ids


def with_ids(args: Sequence[str], uid: int, gid: int) -> list[str]:
    """A box's bwrap ``args`` with its ``--uid``/``--gid`` values replaced."""
    out = list(args)
    for flag, value in (("--uid", uid), ("--gid", gid)):
        out[out.index(flag) + 1] = str(value)
    return out


def box_etc() -> list[str]:
    """The entries of :data:`ETC_ENTRIES` this host has."""
    return [name for name in ETC_ENTRIES if os.path.lexists(f"/etc/{name}")]


@functools.cache
def _executable_dir() -> str:
    """The dir of this interpreter's real executable (resolved once: a walk of its links)."""
    return os.path.dirname(os.path.realpath(sys.executable))


def host_paths(extra: Sequence[str] = ()) -> list[str]:
    """Host paths a box mounts read-only besides ``/usr``: this process's interpreter (its
    venv, its base installation, the real executable's dir) and ``extra``. Outer paths first,
    so a nested one is mounted on top and stays visible."""
    pythons = {sys.prefix, sys.base_prefix, _executable_dir()}
    return sorted(
        (
            p
            for p in pythons | set(extra)
            if p != "/usr" and not p.startswith(("/usr/", "/etc/")) and os.path.exists(p)
        ),
        key=lambda p: (p.count("/"), p),
    )


def image_mounts(
    base: Path, layer_root: Path, node: NodePrograms, ids: tuple[int, int], box_workdir: str
) -> list[str]:
    """A box over an image: its layer as ``/``, the node's programs read-only on top."""
    args = namespaces(host_root=False, uid=ids[0], gid=ids[1])
    args += ["--bind", str(layer_root), "/", "--proc", "/proc", "--dev", "/dev"]
    args += ["--bind", str(base / "bridge"), BRIDGE_DIR]
    args += node.mounts()
    for path in node.node_paths:
        args += ["--ro-bind", path, path]
    return [*args, "--chdir", box_workdir]


def host_mounts(base: Path, workdir: Path, box_workdir: str, ro_binds: Sequence[str]) -> list[str]:
    """A box over the host's root: its own dirs under ``base``, its work dir ``workdir``."""
    args = namespaces()
    args += ["--tmpfs", "/etc"]
    for name in box_etc():
        args += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
    for name in ("passwd", "group"):
        args += ["--ro-bind", str(base / "etc" / name), f"/etc/{name}"]
    args += ["--symlink", "../proc/self/mounts", "/etc/mtab", "--remount-ro", "/etc"]
    args += ["--proc", "/proc", "--dev", "/dev"]
    args += ["--bind", str(base / "tmp"), "/tmp"]
    args += ["--bind", str(base / "bridge"), BRIDGE_DIR]
    args += ["--bind", str(workdir), box_workdir, "--chdir", box_workdir]
    # The host's interpreter (and configured tools) last, so they show through the box's
    # own dirs when they live there: a venv under /tmp, or under the work dir's path.
    for path in host_paths(ro_binds):
        args += ["--ro-bind", path, path]
    # The node's agent tool dir (vfray.runtimes.provision), when a harness made one; after the
    # box's own /tmp too, so a root under /tmp is not hidden.
    tools = str(tools_root())
    if os.path.isdir(tools):
        args += ["--ro-bind", tools, tools]
    return args


def give_owned(top: Path, ids: tuple[int, int], to: tuple[int, int]) -> None:
    """Give what under ``top`` (itself included, symlinks not followed) is owned by ``ids``
    (uid, gid: an image's user, as a root node unpacked it) to ``to`` (the node's user)."""
    for folder, dirs, files in os.walk(top):
        for path in [folder, *(os.path.join(folder, n) for n in dirs + files)]:
            with contextlib.suppress(OSError):
                st = os.lstat(path)
                uid = to[0] if st.st_uid == ids[0] != to[0] else -1
                gid = to[1] if st.st_gid == ids[1] not in (0, to[1]) else -1
                if (uid, gid) != (-1, -1):
                    os.lchown(path, uid, gid)
