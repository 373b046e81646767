"""Run a command the way a batch scheduler runs a job step, for the signal tests.

``python -m tests.scheduled_job -- CMD...`` starts CMD in a session of its own with SIGINT
ignored (what ``cmd &`` in a non-interactive shell, and so many job scripts, hand down), as a
child of this process, which is a child subreaper: every process CMD leaves behind (however it
detached) is re-parented here. SIGTERM sent to this process is passed to CMD only, as
``kill``, Kubernetes and ``ray job stop`` do. When CMD exits, this waits up to a minute for its
descendants to go, then prints ``LEFTOVER <json list of [pid, cmdline]>`` on stderr and exits
with CMD's status (128 + N for a signal, like a shell).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time

_PR_SET_CHILD_SUBREAPER = 36


def descendants(root: int) -> list[tuple[int, str]]:
    """Live (not zombie) descendants of ``root``, with their command lines."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z":
            parents[int(entry)] = int(fields[1])
    found: list[tuple[int, str]] = []
    frontier = {root}
    while frontier:
        children = {pid for pid, ppid in parents.items() if ppid in frontier}
        frontier = children
        for pid in children:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                continue
            found.append((pid, cmd))
    return found


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def main(argv: list[str]) -> int:
    if argv[:1] == ["--"]:
        argv = argv[1:]
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # inherited across exec, as from a shell
    job = subprocess.Popen(argv, start_new_session=True)
    signal.signal(signal.SIGTERM, lambda *_: job.send_signal(signal.SIGTERM))
    print(f"JOB {job.pid}", file=sys.stderr, flush=True)
    code = job.wait()
    deadline = time.monotonic() + 60
    left = descendants(os.getpid())
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        _reap()
        left = descendants(os.getpid())
    print(f"LEFTOVER {json.dumps(left)}", file=sys.stderr, flush=True)
    for pid, _ in left:  # the test fails on them; they must not outlive it
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
