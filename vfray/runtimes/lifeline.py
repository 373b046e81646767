"""The owner's lifeline: one watchdog process per owner process that, once the owner is gone (even
by SIGKILL, when no ``stop`` runs), kills every process the local runtimes started for it.

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
also checks its parent pid (a fork of the owner that inherited the write end delays the EOF).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import uuid

OWNER_ENV = "VFRAY_OWNER_ID"

WATCHDOG = r"""
import os, select, signal, sys, time
needle = sys.argv[1].encode()
fd, owner = int(sys.argv[2]), int(sys.argv[3])
signal.signal(signal.SIGINT, signal.SIG_IGN)
while os.getppid() == owner:
    if select.select([fd], [], [], 1.0)[0] and not os.read(fd, 64):
        break
me, quiet, deadline = os.getpid(), 0, time.monotonic() + 60
while quiet < 3 and time.monotonic() < deadline:
    found = 0
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open("/proc/" + name + "/environ", "rb") as fh:
                environ = fh.read()
        except OSError:
            continue
        if needle in environ and needle in environ.split(b"\0"):
            try:
                os.kill(int(name), signal.SIGKILL)
                found += 1
            except OSError:
                pass
    quiet = 0 if found else quiet + 1
    time.sleep(0.02)
"""
"""Run as ``python -I -S -c WATCHDOG VFRAY_OWNER_ID=TOKEN FD OWNER_PID``. After the owner goes
it sweeps until three walks of /proc in a row find nothing (a process may be mid-fork), for at
most a minute."""


class _Lifeline:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pid = -1
        self.token = ""
        self.write_fd = -1
        self.watchdog: subprocess.Popen[bytes] | None = None


_lifeline = _Lifeline()


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
            # left open (closing it changes nothing: the parent still holds one).
            life.pid, life.token, life.write_fd, life.watchdog = pid, uuid.uuid4().hex, -1, None
        if life.watchdog is not None and life.watchdog.poll() is None:
            return life.token
        if life.write_fd >= 0:
            os.close(life.write_fd)
        read_fd, life.write_fd = os.pipe()  # not inheritable: boxed programs never hold it
        try:
            # The same token after a restart, so the boxes started so far stay covered. Its
            # own session: a signal to the owner's process group must not take it down too.
            life.watchdog = subprocess.Popen(
                [
                    sys.executable,
                    *("-I", "-S", "-c", WATCHDOG),
                    *(f"{OWNER_ENV}={life.token}", str(read_fd), str(pid)),
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                pass_fds=(read_fd,),
                start_new_session=True,
                env={},  # none of the owner's secrets
                cwd="/",
            )
        finally:
            os.close(read_fd)
        return life.token
