"""Running a command as a user of the box (``Runtime.run(user=...)``), which the Harbor verifier
needs for ``[verifier] user``: names resolved by the box's own ``/etc/passwd`` the way ``docker
exec --user`` does, a real bwrap box switching its uid per command, podman's ``--user``, and the
runtimes that cannot switch users refusing in one line. The verifier-user fixture task runs on
docker and bwrap in tests/test_harbor_docker.py and tests/test_harbor_bwrap.py."""

from __future__ import annotations

import os
import pwd
import shutil
from pathlib import Path

import pytest

from vfray.errors import ConfigError, SandboxError
from vfray.runtimes._bwrap_args import user_ids, with_ids
from vfray.runtimes.base import Runtime, RuntimeSpec
from vfray.runtimes.bwrap import BwrapRuntime
from vfray.runtimes.docker import DockerRuntime
from vfray.runtimes.podman import PodmanRuntime
from vfray.runtimes.subprocess import SubprocessRuntime, is_node_user
from vfray.tasksets._harbor_verify import verify
from vfray.trace import TaskRecord, Trace

PASSWD = "root:x:0:0:root:/root:/bin/sh\ngrader:x:1234:1300::/tmp:/bin/sh\nbad:x:x:y\n"
GROUP = "root:x:0:\ngraders:x:1300:\nstaff:x:50:\n"


def test_user_names_resolve_like_docker_exec() -> None:
    assert user_ids("grader", PASSWD, GROUP) == (1234, 1300)
    assert user_ids("1234", PASSWD, GROUP) == (1234, 1300)  # a listed uid takes its gid
    assert user_ids("4321", PASSWD, GROUP) == (4321, 0)  # an unlisted one gets gid 0
    assert user_ids("grader:staff", PASSWD, GROUP) == (1234, 50)
    assert user_ids("root:7", PASSWD, GROUP) == (0, 7)
    assert user_ids("nobody", PASSWD, GROUP) is None
    assert user_ids("grader:nogroup", PASSWD, GROUP) is None
    assert user_ids("bad", PASSWD, GROUP) is None
    args = ["--unshare-user", "--uid", "65534", "--gid", "65534", "--cap-drop", "ALL"]
    assert with_ids(args, 1234, 1300) == [
        "--unshare-user", "--uid", "1234", "--gid", "1300", "--cap-drop", "ALL"
    ]  # fmt: skip


def test_podman_exec_takes_the_user() -> None:
    box = PodmanRuntime()
    box.container_id = "c1"
    args, _ = box._exec_args(["id"], {}, "/", "t", stdin=False, user="grader")
    assert args[args.index("--user") + 1] == "grader" and args[-2:] == ["c1", "id"]
    args, _ = box._exec_args(["id"], {}, "/", "t", stdin=False)
    assert "--user" not in args


async def test_the_subprocess_runtime_refuses_another_user_in_one_line() -> None:
    me = pwd.getpwuid(os.getuid()).pw_name
    assert is_node_user(me) and is_node_user(str(os.getuid()))
    other = "root" if os.getuid() != 0 else "nobody"
    assert not is_node_user(other)
    async with SubprocessRuntime() as box:
        assert (await box.run(["true"], user=me)).ok
        with pytest.raises(SandboxError) as caught:
            await box.run(["true"], user=other)
        said = str(caught.value)
        assert "cannot run one as" in said and "\n" not in said
        # The Harbor verifier says which verifier could not run.
        tests = Path(box.resolve("t"))
        tests.mkdir()
        (tests / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
        trace = Trace(task=TaskRecord(key="k", hash="h"))
        with pytest.raises(SandboxError, match=r"^verifier: the subprocess runtime"):
            await verify(box, [tests], timeout=10, env={}, user=other, trace=trace)


@pytest.mark.bwrap
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bwrap is needed")
async def test_a_bwrap_box_runs_a_command_as_a_user_of_its_passwd() -> None:
    async with BwrapRuntime(RuntimeSpec()) as box:
        said = await box.run(["sh", "-c", "id -u; id -g; id -un"])
        assert said.stdout.split() == ["65534", "65534", "nobody"]
        script = "id -u; id -un; touch own && stat -c %u own"
        said = await box.run(["sh", "-c", script], user="root")
        assert said.ok and said.stdout.split() == ["0", "root", "0"], said
        # The next command is the box's user again: the user is per command.
        assert (await box.run(["id", "-u"])).stdout.strip() == "65534"
        with pytest.raises(SandboxError, match="no user 'grader' in the box's /etc/passwd"):
            await box.run(["true"], user="grader")
        # As a task's agent user: the box's files are the node user's, whom it maps onto.
        await _check_program_user(box, "root", own="65534")


PROGRAM = (
    "id -un; echo more >> .vfray/agent/config; mkdir .vfray/agent/state; cat .vfray/agent/config"
)


async def _check_program_user(box: Runtime, user: str = "nobody", own: str = "0") -> None:
    """A task's agent user (``program_user``): the harness's program runs as it, and the
    agent's files the harness wrote as the box's user are that user's to change."""
    await box.write(".vfray/agent/config", b"written\n")
    box.program_user = user
    done = await box.run_program(["/bin/sh", "-c", PROGRAM])
    assert done.ok and done.stdout.split() == [user, "written", "more"], done
    live = await box.open_process(["id", "-un"])
    assert live.stdout is not None and (await live.stdout.read()).strip() == user.encode()
    await live.wait()
    # run() stays the box's user: the verifier's, the task's setup.
    assert (await box.run(["id", "-u"])).stdout.strip() == own


async def test_harness_programs_run_as_the_program_user_on_docker(
    debian_in_docker: str, docker_url: str
) -> None:
    spec = RuntimeSpec(image=debian_in_docker)
    async with DockerRuntime(spec, base_url=docker_url) as box:
        await _check_program_user(box)


async def test_harness_programs_run_as_the_program_user_on_podman(debian_image: object) -> None:
    from vfray.runtimes import debian_image as base

    assert isinstance(debian_image, base.DebianImage)
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed (apt-get install podman)")
    try:
        PodmanRuntime.preflight({})
    except ConfigError as exc:
        pytest.skip(str(exc))
    async with PodmanRuntime(RuntimeSpec(image=debian_image.oci)) as box:
        await _check_program_user(box)
