"""The bwrap box on real boxes: its interpreter wherever the owner's lives (a venv under /tmp),
and what a program inside can see and do (no root, no capabilities, no host secrets in /etc)."""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from vfray.runtimes.base import RuntimeSpec
from vfray.runtimes.bwrap import BwrapRuntime

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="no bwrap")
ROOT = Path(__file__).resolve().parents[1]

# Run by the /tmp venv's interpreter: a program, the runtime's python, and a bridged fetch
# (through the in-box forwarder, which is the owner's interpreter too).
OWNER = """
import asyncio, json, sys
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from vfray.runtimes.base import RuntimeSpec
from vfray.runtimes.bwrap import BwrapRuntime
from vfray.endpoints.serving import serve_in_loop

FETCH = "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1]).read().decode())"

async def hi(request):
    return PlainTextResponse("hello from host")

async def main():
    async with serve_in_loop(Starlette(routes=[Route("/hi", hi)])) as url, BwrapRuntime() as rt:
        own = await rt.run([sys.executable, "-c", "import sys; print(sys.prefix)"], timeout=60)
        runtime_python = await rt.run([rt.python, "-c", "print('ok')"], timeout=60)
        on_path = await rt.run(["python", "-c", "import sys; print(sys.prefix)"], timeout=60)
        await rt.prepare_execution([await rt.host_url(url)])
        bridged = await rt.run([sys.executable, "-c", FETCH, url + "/hi"], timeout=60)
    print(json.dumps({k: [r.exit_code, r.stdout.strip(), r.stderr[-300:]] for k, r in
                      dict(own=own, runtime_python=runtime_python, on_path=on_path,
                           bridged=bridged).items()}))

asyncio.run(main())
"""


@pytest.fixture
def tmp_venv() -> Iterator[Path]:
    """A real venv under /tmp whose packages are this one's (a .pth file), as a user's
    ``python -m venv /tmp/...`` install of vfray would be."""
    parent = Path(tempfile.mkdtemp(prefix="vfray-test-venv-", dir="/tmp"))
    try:
        venv = parent / "venv"
        subprocess.run(
            [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120
        )
        (pure,) = Path(venv, "lib").glob("python3*/site-packages")
        (pure / "vfray-test.pth").write_text("\n".join([*site.getsitepackages(), str(ROOT)]))
        yield venv
    finally:
        shutil.rmtree(parent, ignore_errors=True)


def test_bwrap_works_with_the_interpreter_in_a_tmp_venv(tmp_venv: Path) -> None:
    python = tmp_venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run(
        [str(python), "-c", OWNER], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout)
    assert seen["own"][:2] == [0, str(tmp_venv)], seen
    assert seen["runtime_python"][:2] == [0, "ok"], seen
    assert seen["on_path"][:2] == [0, str(tmp_venv)], seen
    assert seen["bridged"][:2] == [0, "hello from host"], seen


PROBE = r"""
set -e
id -u; id -g
grep CapEff /proc/self/status
test ! -e /etc/shadow && echo no-shadow
test ! -e /etc/gshadow && echo no-gshadow
cat /etc/passwd | wc -l
echo written > mine.txt && cat mine.txt
echo tmp > /tmp/t && cat /tmp/t
"""


async def test_bwrap_box_is_unprivileged_and_sees_no_host_secrets() -> None:
    async with BwrapRuntime() as rt:
        probe = await rt.run(["bash", "-c", PROBE], timeout=60)
        shadow = await rt.run(["cat", "/etc/shadow"], timeout=60)
        escape = await rt.run(["sh", "-c", "echo x > /etc/vfray-escape"], timeout=60)
        kept = await rt.read("mine.txt")
    assert probe.ok, probe
    lines = probe.stdout.split("\n")
    assert lines[0] != "0" and lines[1] != "0", probe.stdout  # uid, gid
    assert lines[2].split() == ["CapEff:", "0000000000000000"], probe.stdout
    assert "no-shadow" in lines and "no-gshadow" in lines
    assert lines[5] == "2"  # the box's own passwd: root and the box user, no host accounts
    assert lines[6:8] == ["written", "tmp"]
    assert shadow.exit_code != 0 and "No such file" in shadow.stderr
    assert escape.exit_code != 0
    assert kept == b"written\n"


TOOLS = r"""
set -e
python3 -c "import socket, ssl; socket.getaddrinfo('localhost', 80); \
n = ssl.create_default_context().cert_store_stats()['x509_ca']; assert n > 0, n; print('py ok')"
bash -c 'echo bash ok'
whoami
"""


async def test_bwrap_box_still_runs_everyday_programs() -> None:
    async with BwrapRuntime() as rt:
        tools = await rt.run(["bash", "-c", TOOLS], timeout=60)
        git = None
        if shutil.which("git"):
            git = await rt.run(
                [
                    "sh",
                    "-c",
                    "git init -q r && cd r && git -c user.name=v -c user.email=v@x commit -q"
                    " --allow-empty -m one && git log --format=%s",
                ],
                timeout=60,
            )
        node = None
        if shutil.which("node"):
            node = await rt.run(["node", "-e", "console.log(6 * 7)"], timeout=60)
    assert tools.ok, tools
    assert tools.stdout.split("\n")[:3] == ["py ok", "bash ok", "nobody"], tools
    assert git is None or (git.ok and git.stdout.strip() == "one"), git
    assert node is None or (node.ok and node.stdout.strip() == "42"), node


HOG = "b = bytearray(400 * 1024 * 1024)\nfor i in range(0, len(b), 4096): b[i] = 1\nprint('kept')"


@pytest.mark.skipif(
    os.geteuid() != 0 or not os.access("/sys/fs/cgroup/memory", os.W_OK),
    reason="needs a writable cgroup v1 memory controller",
)
async def test_bwrap_cgroup_limits_still_apply_to_the_unprivileged_box() -> None:
    async with BwrapRuntime(RuntimeSpec(memory_gb=0.25, pids=64)) as rt:
        assert rt.cgroup is not None and rt.cgroup.dirs
        small = await rt.run(["python3", "-c", "print('ok')"], timeout=60)
        hog = await rt.run(["python3", "-c", HOG], timeout=120)
        forks = await rt.run(
            ["sh", "-c", "for i in $(seq 100); do sleep 5 & done; echo spawned"],
            timeout=60,
        )
    assert small.ok, small
    assert hog.exit_code == 128 + 9 and "kept" not in hog.stdout, hog  # the cgroup's OOM kill
    assert forks.exit_code != 0 and "fork" in forks.stderr.lower(), forks  # pids.max
