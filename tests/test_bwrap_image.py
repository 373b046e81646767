"""bwrap boxes whose root is an image's root filesystem (issue 28, the bwrap side), on real
bubblewrap: the tests' offline Debian base image unpacked by the node's image store, and a
nearly empty root with no shell and no Python. The node's own programs run there through the
node's loader, the image's ``python3`` stays the image's, each box writes to a layer of its own,
and nothing stays mounted after a stop or after an owner's SIGKILL."""

from __future__ import annotations

import asyncio
import concurrent.futures
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

import vfray as vf
from vfray.endpoints.serving import serve_in_loop
from vfray.errors import SandboxError
from vfray.runtimes._overlay import BACKENDS, available
from vfray.runtimes._reap import mount_points_under
from vfray.runtimes.base import Runtime, RuntimeSpec
from vfray.runtimes.bwrap import BwrapRuntime

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="no bwrap"),
]

HOST_MARKER = Path("/root/.vfray-test-host-marker")


@pytest.fixture(scope="session")
def debian_root(debian_image: object) -> Path:
    """The offline Debian base image (tests/conftest.py), unpacked by the node's image store
    once per machine (its default cache dir): a root with its config (environment, user)."""
    from vfray.runtimes.debian_image import DebianImage
    from vfray.runtimes.images import rootfs

    assert isinstance(debian_image, DebianImage)
    # A thread of its own: the fixture may first be asked for inside a test's running loop.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, rootfs(debian_image.oci)).result()


@pytest.fixture
def bare_root(tmp_path: Path) -> Path:
    """A few files, no shell, no Python, no libc."""
    root = tmp_path / "bare"
    (root / "etc").mkdir(parents=True)
    (root / "data").mkdir()
    (root / "data" / "greeting").write_text("hello from the image\n")
    (root / "etc" / "os-release").write_text("ID=bare\n")
    return root


@pytest.fixture(autouse=True)
def host_marker() -> Iterator[None]:
    """A file only the host has: no box over an image may see it."""
    HOST_MARKER.write_text("host only\n")
    yield
    HOST_MARKER.unlink(missing_ok=True)


def box(root: Path, **options: Any) -> BwrapRuntime:
    return BwrapRuntime(RuntimeSpec(rootfs=str(root), workdir="/testbed"), **options)


def mounted_under(path: Path | None) -> list[str]:
    return mount_points_under(str(path)) if path is not None else []


PROBE = (
    "import os, sys; print(os.getcwd()); print(sys.prefix); "
    f"print(os.path.exists({str(HOST_MARKER)!r})); print(open('/data/greeting').read().strip())"
)


async def test_a_bare_root_runs_the_nodes_python_and_hides_the_host(bare_root: Path) -> None:
    rt = box(bare_root, require_shell=False)
    await rt.start()
    base = rt.base
    try:
        await rt.write("in.txt", b"from the hook")
        done = await rt.run([rt.python, "-I", "-S", "-c", PROBE], timeout=60)
        assert done.ok, done.stderr
        cwd, prefix, marker, greeting = done.stdout.split("\n")[:4]
        assert cwd == "/testbed"
        assert prefix == sys.base_prefix  # the node's Python, mounted read-only
        assert marker == "False"  # the host's /root is not the box's
        assert greeting == "hello from the image"
        copied = await rt.run([rt.python, "-I", "-S", "-c", "open('out.txt','w').write("
                               "open('in.txt').read().upper())"], timeout=60)  # fmt: skip
        assert copied.ok, copied.stderr
        assert await rt.read("/testbed/out.txt") == b"FROM THE HOOK"
        assert mounted_under(base)  # its own layer, mounted
    finally:
        await rt.stop()
    assert not mounted_under(base)
    assert base is not None and not base.exists()
    assert not (bare_root / "testbed").exists()  # the image's root is never written


async def test_a_root_with_no_shell_is_refused_in_one_line(bare_root: Path) -> None:
    rt = box(bare_root)
    with pytest.raises(SandboxError) as caught:
        await rt.start()
    await rt.stop()
    message = str(caught.value)
    assert "has no /bin/sh" in message and "\n" not in message
    assert not mounted_under(rt.base)


async def test_the_images_python_stays_the_images_while_the_bridge_works(
    debian_root: Path,
) -> None:
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    async def hi(request: Any) -> PlainTextResponse:
        return PlainTextResponse("hello from host")

    fetch = (
        "import sys, urllib.request; print(sys.prefix, sys.executable); "
        "print(urllib.request.urlopen(sys.argv[1]).read().decode())"
    )
    async with serve_in_loop(Starlette(routes=[Route("/hi", hi)])) as url:
        rt = box(debian_root)
        await rt.start()
        try:
            await rt.prepare_execution([await rt.host_url(url)])
            done = await rt.run(["python3", "-c", fetch, url + "/hi"], timeout=60)
            assert done.ok, done.stderr
            assert done.stdout.split("\n")[:2] == ["/usr /usr/bin/python3", "hello from host"]
            shell = await rt.run(["/bin/sh", "-c", f"pwd; cat {HOST_MARKER} || echo absent"])
            assert shell.stdout.split("\n")[:2] == ["/testbed", "absent"], shell
        finally:
            await rt.stop()
    assert not mounted_under(rt.base)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_each_box_writes_to_a_layer_of_its_own(bare_root: Path, backend: str) -> None:
    if not available(backend):  # type: ignore[arg-type]
        pytest.skip(f"{backend} overlay is not available here")
    write = "open('/data/greeting', 'w').write('changed'); open('/data/new', 'w').write('x')"
    read = "import os; print(open('/data/greeting').read(), os.path.exists('/data/new'))"
    first, second = (
        box(bare_root, require_shell=False, overlay=backend),
        box(bare_root, require_shell=False, overlay=backend),
    )
    await first.start()
    await second.start()
    try:
        assert (await first.run([first.python, "-I", "-S", "-c", write], timeout=60)).ok
        mine = await first.run([first.python, "-I", "-S", "-c", read], timeout=60)
        other = await second.run([second.python, "-I", "-S", "-c", read], timeout=60)
        assert mine.stdout.strip() == "changed True", mine
        assert other.stdout.strip() == "hello from the image\n False", other
    finally:
        await first.stop()
        await second.stop()
    assert (bare_root / "data" / "greeting").read_text() == "hello from the image\n"
    assert not (bare_root / "data" / "new").exists()
    assert not mounted_under(first.base) and not mounted_under(second.base)


# -- rollouts through the interception ----------------------------------------------------


class ImageBox(BwrapRuntime):
    """The bwrap runtime with the test's root as every task's image root (what the node's image
    store fills in from ``task.image``)."""

    root: ClassVar[str] = ""
    started: ClassVar[list[Path]] = []
    """The work dirs of the boxes this class started (the test's own, not other sessions')."""

    def __init__(self, spec: RuntimeSpec | None = None, **options: Any) -> None:
        spec = (spec or RuntimeSpec()).model_copy(update={"rootfs": self.root})
        super().__init__(spec, **options)

    async def start(self) -> None:
        await super().start()
        if self.workdir is not None:
            ImageBox.started.append(self.workdir)


MULTIPLY = (
    "a, b = open('fixture.txt').read().split(); open('product', 'w').write(str(int(a) * int(b)))"
)
WHERE = f"import os; print(os.getcwd(), os.path.exists({str(HOST_MARKER)!r}))"


class FileTask(vf.Task[vf.TaskData]):
    """Setup writes a file at the work dir; the reward runs a command on it there, reads what
    it wrote, and checks the box's view (its work dir, no host file) and the model's answer."""

    async def setup(self, trace: vf.Trace, runtime: Runtime) -> None:
        await runtime.write("fixture.txt", b"6 9")

    @vf.reward
    async def right(self, trace: vf.Trace, runtime: Runtime) -> bool:
        done = await runtime.run([runtime.python, "-I", "-S", "-c", MULTIPLY], timeout=60)
        seen = await runtime.run([runtime.python, "-I", "-S", "-c", WHERE], timeout=60)
        product = await runtime.read("/testbed/product")
        assert done.ok, done.stderr
        assert seen.stdout.strip() == "/testbed False", seen
        assert product == b"54"
        return "54" in (trace.last_reply or "")


CASES = {
    # harness: (model, prompt, root fixture, runtime options): null needs no shell.
    "null": ("scripted:arithmetic", "What is 6 times 9?", "bare_root", {"require_shell": False}),
    "bash": (
        "scripted:bash",
        "Run `echo $((6 * 9))` and report what it prints.",
        "debian_root",
        {},
    ),
}


@pytest.mark.parametrize("harness", ["null", "bash"])
async def test_a_rollout_scores_through_the_interception_in_the_image(
    harness: str, request: pytest.FixtureRequest
) -> None:
    model, prompt, fixture, options = CASES[harness]
    ImageBox.root = str(request.getfixturevalue(fixture))
    task = FileTask(vf.TaskData(prompt=prompt, image="test-image", workdir="/testbed"))
    ImageBox.started.clear()
    trace = await vf.run_rollout(
        task, model=model, harness=harness, runtime=f"{__name__}:ImageBox",
        runtime_options=options,
    )  # fmt: skip
    assert trace.ok, trace.errors
    assert trace.reward == 1.0
    assert len(ImageBox.started) == 1
    # Only this rollout's box is looked at: boxes of tests running beside this one may be up.
    assert _mounts_under(ImageBox.started[0]) == set()


def _mounts_under(folder: Path) -> set[str]:
    """Mount points at or below ``folder``."""
    with open("/proc/self/mountinfo") as fh:
        points = {line.split()[4] for line in fh}
    return {p for p in points if p == str(folder) or p.startswith(f"{folder}/")}


async def test_64_concurrent_image_boxes(debian_root: Path) -> None:
    """64 boxes at once on the Debian root: each starts, writes, reads back, runs the image's
    shell and the node's Python, and stops; no errors and nothing left mounted."""

    async def one(i: int) -> str:
        rt = box(debian_root)
        try:
            await rt.start()
            await rt.write("n.txt", str(i).encode())
            shell = await rt.run(["/bin/sh", "-c", "cat n.txt; echo; cat /etc/debian_version"])
            node = await rt.run([rt.python, "-I", "-S", "-c", "print(open('n.txt').read())"])
            if not (shell.ok and node.ok and shell.stdout.startswith(f"{i}\n12.")):
                return f"box {i}: {shell} {node}"
            if node.stdout.strip() != str(i):
                return f"box {i}: {node}"
            return ""
        except Exception as exc:
            return f"box {i}: {type(exc).__name__}: {exc}"
        finally:
            await rt.stop()
            if mounted_under(rt.base):
                return f"box {i}: left mounted"  # noqa: B012

    errors = [e for e in await asyncio.gather(*(one(i) for i in range(64))) if e]
    assert errors == []


OWNER = textwrap.dedent(
    """
    import asyncio, sys, time
    from vfray.runtimes.base import RuntimeSpec
    from vfray.runtimes.bwrap import BwrapRuntime

    async def main():
        rt = BwrapRuntime(RuntimeSpec(rootfs=sys.argv[1], workdir="/testbed"),
                          require_shell=False)
        await rt.start()
        await rt.open_process([rt.python, "-I", "-S", "-c", "import time; time.sleep(300)"])
        print(rt.base, flush=True)
        time.sleep(300)

    asyncio.run(main())
    """
)


async def test_a_sigkilled_owner_leaves_nothing_mounted(bare_root: Path) -> None:
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(bare_root)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert owner.stdout is not None
        base = Path(owner.stdout.readline().strip())
        assert mounted_under(base), "the box's layer is mounted while its owner lives"
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    # The owner's watchdog reaps: its box processes, then the mount, then the dir.
    for _ in range(1500):
        if not mounted_under(base) and not base.exists():
            break
        await asyncio.sleep(0.02)
    assert not mounted_under(base)
    assert not base.exists()


# -- the provisioned agents, from the node's tool dir, in the image ---------------------------


class WroteFile(vf.Task[vf.TaskData]):
    @vf.reward
    async def wrote_it(self, runtime: Runtime) -> bool:
        return (await runtime.read("/testbed/out.txt")) == b"hello agent\n"


@pytest.mark.parametrize("harness_id", ["mini-swe-agent", "codex", "claude-code"])
async def test_a_provisioned_agent_solves_a_task_in_the_image(
    harness_id: str, debian_root: Path
) -> None:
    """The agent program is the node's (its tool dir, its Python or Node through the node's
    loader); the commands it runs are the image's."""
    from vfray.harnesses.provisioned import ProvisionedHarness
    from vfray.harnesses.registry import make_harness
    from vfray.runtimes.provision import find_tool

    harness = make_harness(harness_id)
    assert isinstance(harness, ProvisionedHarness)
    if find_tool(harness.tool_spec(), harness.tools_root) is None:
        pytest.skip(f"{harness_id} is not provisioned on this node (tests/test_agents.py does)")
    ImageBox.root = str(debian_root)
    data = vf.TaskData(
        prompt='Write "hello agent" to out.txt, then check it.', image="x", workdir="/testbed"
    )
    trace = await vf.run_rollout(
        WroteFile(data), model="scripted:agent", harness=harness_id,
        runtime=f"{__name__}:ImageBox",
    )  # fmt: skip
    assert trace.errors == [], trace.errors
    assert trace.rewards["wrote_it"].value == 1.0


@pytest.mark.skipif(shutil.which("tmux") is None, reason="no tmux on this machine")
async def test_terminus_2_solves_a_task_in_the_image(debian_root: Path) -> None:
    """terminus-2's program and tmux come from the node's tool dir (tmux with the libraries the
    image lacks); the pane's shell and the commands typed into it are the image's."""
    ImageBox.root = str(debian_root)
    data = vf.TaskData(
        prompt='Write "hello agent" to out.txt, then check it.', image="x", workdir="/testbed"
    )
    trace = await vf.run_rollout(
        WroteFile(data), model="scripted:agent", harness="terminus-2",
        runtime=f"{__name__}:ImageBox",
    )  # fmt: skip
    assert trace.errors == [], trace.errors
    assert trace.rewards["wrote_it"].value == 1.0
    assert len(trace.calls) == 4  # write, cat, task_complete and its confirmation
