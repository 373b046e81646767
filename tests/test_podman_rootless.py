"""The podman runtime rootless: vfray run by a user that is not root (``vfray-rootless``, made
here with ``useradd`` and a subuid/subgid range when missing, its podman store on native
overlay), one scored bash rollout in the offline Debian image through the interception, and a
box whose memory limit holds although rootless podman on cgroup v1 drops cgroup limits, and
whose setup reaches the Debian mirror through the egress proxy and its agent phase does not.

Skipped with the reason where this machine cannot (not root, no podman or useradd, or ``podman
info`` failing for the user). The user's podman keeps a pause process; it is ended after."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import site
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

USER = "vfray-rootless"
REPO = str(Path(__file__).resolve().parent.parent)
STORAGE_CONF = '[storage]\ndriver = "overlay"\n'
"""Native overlay (kernel 5.13+ in a user namespace): without it podman 4.3 picks vfs here,
which copies the whole image for each container."""


@dataclass
class Rootless:
    user: pwd.struct_passwd
    image: str

    def run(self, code: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """``python3 -c code`` as the user, importing this checkout and the dev venv's
        packages (the venv's own interpreter lives under root's home, which the user cannot
        enter; the system Python is the same 3.11)."""
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": self.user.pw_dir,
            "USER": USER,
            "LOGNAME": USER,
            "PYTHONPATH": ":".join([REPO, *site.getsitepackages()]),
        }
        return subprocess.run(
            ["runuser", "-u", USER, "--", "env", "-i", *(f"{k}={v}" for k, v in env.items()),
             "/usr/bin/python3", "-c", code, *args],
            capture_output=True, text=True, timeout=timeout, cwd="/tmp", check=False,
        )  # fmt: skip


def _sh(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)


def _make_user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(USER)
    except KeyError:
        pass
    made = _sh("useradd", "--create-home", "--shell", "/bin/sh", USER)
    if made.returncode:
        pytest.skip(f"cannot add user {USER}: {made.stderr.strip()}")
    return pwd.getpwnam(USER)


def _subids(user: pwd.struct_passwd) -> None:
    """A subordinate id range of 65536 for the user (useradd gives one on Debian)."""
    for table, flag in (("/etc/subuid", "--add-subuids"), ("/etc/subgid", "--add-subgids")):
        text = Path(table).read_text() if Path(table).exists() else ""
        if any(line.startswith(f"{USER}:") for line in text.splitlines()):
            continue
        ends = [int(f[1]) + int(f[2]) for f in (ln.split(":") for ln in text.splitlines())
                if len(f) == 3 and f[1].isdigit() and f[2].isdigit()]  # fmt: skip
        start = max([100000, *ends])
        added = _sh("usermod", flag, f"{start}-{start + 65535}", USER)
        if added.returncode:
            pytest.skip(f"cannot give {USER} subordinate ids: {added.stderr.strip()}")


def _end_pause(user: pwd.struct_passwd) -> None:
    """End the user's podman pause process (it keeps the rootless user namespace)."""
    found = Path(f"/tmp/podman-run-{user.pw_uid}/libpod/tmp/pause.pid")
    try:
        pid = int(found.read_text().strip())
        if os.stat(f"/proc/{pid}").st_uid == user.pw_uid:
            os.kill(pid, signal.SIGKILL)  # it blocks SIGTERM
    except (OSError, ValueError):
        pass


@pytest.fixture(scope="module")
def rootless(debian_image: object) -> Iterator[Rootless]:
    from vfray.runtimes.debian_image import DebianImage

    assert isinstance(debian_image, DebianImage)
    if os.geteuid() != 0 or not all(shutil.which(t) for t in ("podman", "runuser", "useradd")):
        pytest.skip("needs root (to add the user), podman, runuser and useradd")
    if not Path("/usr/bin/python3").exists() or sys.version_info[:2] != (3, 11):
        pytest.skip("needs the system Python 3.11 to import the dev venv's packages")
    user = _make_user()
    _subids(user)
    conf = Path(user.pw_dir, ".config", "containers", "storage.conf")
    if not conf.exists():
        conf.parent.mkdir(parents=True, exist_ok=True)
        conf.write_text(STORAGE_CONF)
        _sh("chown", "-R", f"{user.pw_uid}:{user.pw_gid}", str(Path(user.pw_dir, ".config")))
    # The base image's layout is root's (umoci writes 0600 files): a copy the user can read.
    where = Path(tempfile.mkdtemp(prefix="vfray-rootless-"))
    shutil.copytree(debian_image.layout, where / "oci")
    _sh("chown", "-R", f"{user.pw_uid}:{user.pw_gid}", str(where))
    env = Rootless(user, f"oci:{where / 'oci'}:{debian_image.tag}")
    try:
        info = env.run(
            "from vfray.runtimes.podman import PodmanRuntime; PodmanRuntime.preflight({})"
        )
        if info.returncode:
            pytest.skip(f"rootless podman cannot run here: {info.stderr.strip()[-400:]}")
        yield env
    finally:
        _end_pause(user)
        shutil.rmtree(where, ignore_errors=True)


ROLLOUT = """
import asyncio, json, os, sys
RELEASE = "http://deb.debian.org/debian/dists/bookworm/InRelease"
import vfray as vf
from vfray.runtimes.base import RuntimeSpec
from vfray.runtimes.podman import PodmanRuntime

FETCH = (
    "import urllib.request\\n"
    "try:\\n"
    "    print(urllib.request.urlopen(" + repr(RELEASE) + ", timeout=30).read(6).decode())\\n"
    "except Exception as exc:\\n"
    "    print('refused', exc)\\n"
)

class Multiply(vf.Task[vf.TaskData]):
    async def setup(self, trace, runtime):
        await runtime.write("fixture.txt", b"6 9")

    @vf.reward
    async def right(self, trace, runtime):
        done = await runtime.run(["sh", "-c", "id -u; pwd; cat fixture.txt"], timeout=60)
        trace.metrics["probe"] = done.stdout + done.stderr
        return float(done.stdout.split() == ["0", "/testbed", "6", "9"]
                     and "54" in (trace.last_reply or ""))

async def main():
    task = Multiply(vf.TaskData(prompt="Run `echo $((6 * 9))` and report what it prints.",
                                image=sys.argv[1], workdir="/testbed"))
    trace = await vf.run_rollout(task, model="scripted:bash", harness="bash", runtime="podman")
    box = PodmanRuntime(RuntimeSpec(image=sys.argv[1], memory_gb=0.25))
    try:
        await box.start()
        big = await box.run(["python3", "-c", "bytearray(400 * 2**20); print('allocated')"])
        small = await box.run(["python3", "-c", "bytearray(20 * 2**20); print('allocated')"])
        setup = await box.run(["python3", "-c", FETCH], timeout=120)
        await box.prepare_execution([])
        agent = await box.run(["python3", "-c", FETCH], timeout=120)
    finally:
        await box.stop()
    print(json.dumps({"uid": os.getuid(), "reward": trace.reward,
                      "errors": [e.message for e in trace.errors], "metrics": trace.metrics,
                      "big": big.stdout + big.stderr, "small": small.stdout,
                      "setup": setup.stdout, "agent": agent.stdout}))

asyncio.run(main())
"""


def test_a_rollout_scores_on_rootless_podman_and_its_memory_limit_holds(
    rootless: Rootless,
) -> None:
    done = rootless.run(ROLLOUT, rootless.image, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert said["uid"] == rootless.user.pw_uid
    assert said["errors"] == [] and said["reward"] == 1.0, said
    assert "MemoryError" in said["big"] and said["small"].strip() == "allocated", said
    # Setup through the node's egress proxy (the user's gate), the agent phase refused.
    assert said["setup"].strip() == "-----B", said
    assert said["agent"].startswith("refused HTTP Error 403"), said
    leftover = subprocess.run(
        ["runuser", "-u", USER, "--", "podman", "ps", "-aq", "--filter", "label=vfray.box"],
        capture_output=True, text=True, cwd="/tmp", check=False,
    )  # fmt: skip
    assert leftover.stdout.strip() == "", leftover
