"""What a program in a box cannot do, on real boxes: a bwrap box cannot create a nested user
namespace (``unshare -U`` fails there, while it works on the host); a docker box has no
capabilities and no way to gain privileges (``CapEff``/``CapBnd`` empty, ``NoNewPrivs: 1`` in
``/proc/self/status``), and runs as the ``user`` it is given; a command the bash harness's tool
runs finds the rollout's interception key neither in its environment nor in any process's
``/proc/PID/environ`` it can read; the interception's ``/health``, which every box can reach,
answers liveness and nothing about the rollouts that are live."""

from __future__ import annotations

import asyncio
import shutil
import subprocess

import pytest

from vfray.runtimes.base import RuntimeSpec
from vfray.runtimes.bwrap import BwrapRuntime


@pytest.mark.skipif(
    shutil.which("bwrap") is None or shutil.which("unshare") is None, reason="no bwrap/unshare"
)
def test_a_bwrap_box_cannot_create_a_user_namespace() -> None:
    # The host can (so the refusal below is the box's, not the machine's).
    assert subprocess.run(["unshare", "-U", "true"], timeout=30).returncode == 0

    async def main() -> tuple[int, str, int]:
        async with BwrapRuntime() as rt:
            nested = await rt.run(["unshare", "-U", "true"], timeout=60)
            plain = await rt.run(["true"], timeout=60)
        return nested.exit_code, nested.stderr, plain.exit_code

    nested_rc, stderr, plain_rc = asyncio.run(main())
    assert plain_rc == 0
    assert nested_rc != 0, stderr
    assert "unshare failed" in stderr, stderr


def _status(text: str) -> dict[str, str]:
    return dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)


@pytest.mark.docker
@pytest.mark.parametrize("user", [None, "65534:65534"])
async def test_a_docker_box_has_no_capabilities_and_no_new_privileges(
    docker_url: str, user: str | None
) -> None:
    from docker_engine import IMAGE, VOLUMES

    from vfray.runtimes.docker import DockerRuntime

    # A work dir the non-root user can create (the test image's /work is root's).
    spec = RuntimeSpec(image=IMAGE, workdir="/tmp/box")
    async with DockerRuntime(spec, base_url=docker_url, volumes=dict(VOLUMES), user=user) as rt:
        seen = await rt.run(["cat", "/proc/self/status"], timeout=60)
        await rt.write("given.txt", b"x\n")
        wrote = await rt.run(
            ["sh", "-c", "echo hi > made && echo y >> given.txt && cat made given.txt"],
            timeout=60,
        )
    assert seen.ok, seen
    status = _status(seen.stdout)
    zero = "0" * 16
    for field in ("CapEff", "CapPrm", "CapBnd", "CapAmb"):
        assert status[field].strip() == zero, (field, status[field])
    assert status["NoNewPrivs"].strip() == "1"
    uid = status["Uid"].split()[0]
    assert uid == ("0" if user is None else "65534"), status["Uid"]
    # The box's user owns its work dir and the files written for it.
    assert wrote.stdout.split() == ["hi", "x", "y"], wrote


# Every process environment the tool's command can read, searched for the key's variable (the
# chat loop itself, its parent the box's forwarder, and the command's own).
LOOK_FOR_THE_KEY = """```
echo "own:$(env | grep -c '^VFRAY_API_KEY=')"
n=0
for f in /proc/[0-9]*/environ; do
  if tr '\\0' '\\n' < "$f" 2>/dev/null | grep -q '^VFRAY_API_KEY='; then n=$((n+1)); fi
done
echo "readable:$n"
echo "files:$(ls .vfray | grep -c '^key-')"
echo "parent:$(tr '\\0' '\\n' < /proc/$PPID/environ 2>&1 | grep -c '^VFRAY_API_KEY=')"
```"""


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="no bwrap")
async def test_the_bash_tool_cannot_read_the_rollout_key() -> None:
    import vfray as vf

    trace = await vf.run_rollout(
        vf.Task(vf.TaskData(prompt=LOOK_FOR_THE_KEY)),
        model="scripted:bash",
        harness="bash",
        runtime="bwrap",
    )
    assert trace.errors == [], trace.errors
    seen = trace.last_reply or ""
    assert "own:0" in seen and "readable:0" in seen and "parent:0" in seen, seen
    assert "files:0" in seen, seen  # the key file is gone once the program read it


async def test_health_tells_a_box_nothing_about_live_sessions() -> None:
    import httpx

    from vfray.interception import Interception, Upstream
    from vfray.models.scripted.server import scripted_server
    from vfray.trace import TaskRecord, Trace

    with scripted_server("echo") as model:
        async with Interception(Upstream(model, "upstream-key", model="m")) as icpt:
            for _ in range(3):
                icpt.app.register(Trace(task=TaskRecord(key="k", hash="h")))
            assert icpt.app.session_count == 3
            async with httpx.AsyncClient() as http:
                health = await http.get(f"{icpt.root_url}/health")
    assert health.status_code == 200
    assert health.json() == {"status": "ok"}
