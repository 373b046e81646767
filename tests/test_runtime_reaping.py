"""What a SIGKILLed owner leaves, reaped on real boxes: by its lifeline watchdog, or (when the
watchdog died too) by the next owner's first box start. Live owners are never touched."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from vfray.runtimes import _reap
from vfray.runtimes.strays import marked_pids

ROOT = Path(__file__).resolve().parents[1]
HAS_BWRAP = shutil.which("bwrap") is not None

# The owner: starts one box per kind (bwrap with limits, so with cgroups where they work), each
# running a program that leaves a background process, prints what it holds, then waits to die.
OWNER = """
import asyncio, json, os, sys
from vfray.runtimes import lifeline
from vfray.runtimes.base import RuntimeSpec
from vfray.runtimes.docker import DockerRuntime
from vfray.runtimes.registry import make_runtime

async def main():
    root, kinds, docker = sys.argv[1], sys.argv[2].split(","), json.loads(sys.argv[3])
    spec = RuntimeSpec(memory_gb=0.5, cpu=1.0, pids=256)
    held = {"watchdog": None, "boxes": {}}
    for kind in kinds:
        if kind == "docker":
            rt = DockerRuntime(spec.model_copy(update={"image": docker["image"]}),
                               base_url=docker["url"], volumes=docker["volumes"])
        else:
            rt = make_runtime(kind, spec, root=root)
        await rt.start()
        ran = await rt.run(["sh", "-c", "nohup sleep 300 >/dev/null 2>&1 & echo started"],
                           timeout=60)
        assert ran.ok, ran
        base = getattr(rt, "base", None) or rt.workdir
        cgroup = getattr(rt, "cgroup", None)
        held["boxes"][kind] = {
            "box_id": rt.box_id, "dir": str(base),
            "cgroups": [str(d) for d in cgroup.dirs] if cgroup else [],
            "container": rt.container.id if kind == "docker" else None,
        }
    held["watchdog"] = lifeline._lifeline.watchdog_pid
    held["token"] = lifeline._lifeline.token
    held["lock"] = os.path.join(lifeline.owners_dir(), held["token"])
    print(json.dumps(held), flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""

# The next owner: starts one box of each kind (which sweeps first), stops it, says it is done.
NEXT = """
import asyncio, json, sys
from vfray.runtimes.base import RuntimeSpec
from vfray.runtimes.docker import DockerRuntime
from vfray.runtimes.registry import make_runtime

async def main():
    root, kinds, docker = sys.argv[1], sys.argv[2].split(","), json.loads(sys.argv[3])
    for kind in kinds:
        if kind == "docker":
            rt = DockerRuntime(RuntimeSpec(image=docker["image"]), base_url=docker["url"],
                               volumes=docker["volumes"])
        else:
            rt = make_runtime(kind, root=root)
        async with rt:
            pass
    print("swept")

asyncio.run(main())
"""


OWNERS_TMP = tempfile.mkdtemp(prefix="vfray-test-owners-")
"""The test owners' TMPDIR, so their lock files are in an owners dir of their own: every other
box start on the machine sweeps the dead owners it can tell (by their lock files), and during
the suite one did reap a killed test owner before the test could see what it had left."""
atexit.register(shutil.rmtree, OWNERS_TMP, ignore_errors=True)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": OWNERS_TMP}


def start_owner(
    root: str, kinds: list[str], docker: dict[str, object] | None = None, prelude: str = ""
) -> tuple[subprocess.Popen[str], dict[str, object]]:
    owner = subprocess.Popen(
        [sys.executable, "-c", prelude + OWNER, root, ",".join(kinds), json.dumps(docker or {})],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    assert owner.stdout is not None and owner.stderr is not None
    line = owner.stdout.readline()
    if not line:
        owner.kill()
        raise AssertionError(f"the owner did not start its boxes: {owner.stderr.read()[-3000:]}")
    held: dict[str, object] = json.loads(line)
    return owner, held


def run_next_owner(root: str, kinds: list[str], docker: dict[str, object] | None = None) -> None:
    done = subprocess.run(
        [sys.executable, "-c", NEXT, root, ",".join(kinds), json.dumps(docker or {})],
        capture_output=True,
        text=True,
        timeout=300,
        env=_env(),
    )
    assert done.returncode == 0 and "swept" in done.stdout, done.stderr[-3000:]


def leftovers(held: dict[str, object], docker_url: str | None = None) -> list[str]:
    """Everything of the owner's boxes still there."""
    left: list[str] = []
    boxes = held["boxes"]
    assert isinstance(boxes, dict)
    for kind, box in boxes.items():
        live = [p for p in marked_pids(box["box_id"]) if not _zombie(p)]
        left += [f"{kind} process {p}" for p in live]
        left += [f"{kind} dir {box['dir']}"] if os.path.exists(box["dir"]) else []
        left += [f"{kind} cgroup {c}" for c in box["cgroups"] if os.path.exists(c)]
        if box["container"] and docker_url:
            label = f"{_reap.OWNER_LABEL}={held['token']}"
            left += [f"container {str(c['Id'])[:12]}" for c in _reap._containers(docker_url, label)]
    return left


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def wait_until_clean(held: dict[str, object], docker_url: str | None = None) -> list[str]:
    deadline = time.monotonic() + 60
    while (left := leftovers(held, docker_url)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


@pytest.fixture
def root() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="vfray-test-reap-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


LOCAL = ["subprocess", *(["bwrap"] if HAS_BWRAP else [])]


def test_the_watchdog_reaps_a_sigkilled_owners_boxes(root: str) -> None:
    owner, held = start_owner(root, LOCAL)
    assert leftovers(held), "the owner holds nothing to reap"
    if HAS_BWRAP and os.geteuid() == 0 and Path("/sys/fs/cgroup/memory").is_dir():
        assert held["boxes"]["bwrap"]["cgroups"], "the bwrap box has no cgroup to leak"  # type: ignore[index]
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    assert wait_until_clean(held) == []
    lock = Path(_reap_lock(held))
    deadline = time.monotonic() + 30
    while lock.exists() and time.monotonic() < deadline:  # removed last, once all is reaped
        time.sleep(0.05)
    assert not lock.exists()


# An owner whose fds are past select()'s limit of 1024 when it starts its watchdog (a busy
# SandboxHost's sockets and pipes): the pipes the watchdog reads keep their numbers.
MANY_FDS = """
import os, resource
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4096)), hard))
held_open = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
"""


def test_an_owner_with_fds_past_1024_is_reaped(root: str) -> None:
    owner, held = start_owner(root, LOCAL, prelude=MANY_FDS)
    assert leftovers(held), "the owner holds nothing to reap"
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    assert wait_until_clean(held) == []


def _reap_lock(held: dict[str, object]) -> str:
    return str(held["lock"])


# An owner whose lock is still held by a helper (as by a fork of the owner) for HOLD seconds
# after the owner has exited: what the watchdog saw in CI, where the pipe's EOF came before the
# kernel dropped the dying owner's own lock.
OWNER_WITH_A_HELPER = """
import fcntl, json, os, subprocess, sys
from vfray.runtimes import _reap
owners, token, hold = sys.argv[1], sys.argv[2], sys.argv[3]
lock = os.open(os.path.join(owners, token), os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(lock, fcntl.LOCK_EX)
quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
helper = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({hold})"],
                          pass_fds=(lock,), **quiet)
read_fd, write_fd = os.pipe()
watchdog = subprocess.Popen(
    [sys.executable, "-I", "-S", _reap.__file__, token, str(read_fd), str(os.getpid()), owners],
    pass_fds=(read_fd,), start_new_session=True, **quiet)
print(json.dumps({"helper": helper.pid, "watchdog": watchdog.pid}), flush=True)
"""


def _owner_with_a_helper(hold: float) -> tuple[Path, dict[str, int]]:
    owners = Path(tempfile.mkdtemp(prefix="vfray-test-owners-", dir=OWNERS_TMP))
    token = os.urandom(16).hex()
    done = subprocess.run(
        [sys.executable, "-c", OWNER_WITH_A_HELPER, str(owners), token, str(hold)],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return owners / token, json.loads(done.stdout)


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not _zombie(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return _zombie(pid)


def test_the_watchdog_removes_a_lock_dropped_just_after_the_owner_died() -> None:
    """The CI failure: the owner's pipe said EOF while its lock was still held (the kernel
    dropped it 90 ms later), and the watchdog, having found it held, kept the lock file for
    good. The watchdog now asks again after reaping, for up to ``LOCK_GRACE_S``."""
    lock, pids = _owner_with_a_helper(hold=1.0)
    assert _wait_gone(pids["watchdog"], timeout=30), "the watchdog did not finish"
    assert not lock.exists()


def test_a_lock_a_fork_of_the_owner_holds_on_is_left_for_a_later_sweep() -> None:
    """Held past the grace: the watchdog leaves the lock file (a sweep must never take a live
    owner's), and the first sweep once the holder is gone removes it."""
    lock, pids = _owner_with_a_helper(hold=600)
    try:
        assert _wait_gone(pids["watchdog"], timeout=30), "the watchdog did not finish"
        assert lock.exists()
        assert _reap.sweep_dead(str(lock.parent), []) == []  # still held: not touched
    finally:
        kill(pids["helper"])
    assert _wait_gone(pids["helper"], timeout=30)
    assert _reap.sweep_dead(str(lock.parent), []) == [lock.name]
    assert not lock.exists()


def test_the_next_owner_reaps_what_a_dead_owner_and_its_watchdog_left(root: str) -> None:
    owner, held = start_owner(root, LOCAL)
    kill(int(held["watchdog"]))  # type: ignore[call-overload]
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    time.sleep(0.5)
    assert leftovers(held), "nothing leaked: the test shows nothing"
    run_next_owner(root, LOCAL)
    # Bounded wait: on a loaded CI machine the dirs were still there right after the next
    # owner's sweep once (not seen on a quiet one); nothing but a reaper removes them.
    assert wait_until_clean(held) == []
    assert not Path(_reap_lock(held)).exists()


def test_a_sweep_from_another_root_reaps_the_dead_owners_own_roots(root: str) -> None:
    """The CI failure of stop 23: another process's sweep (its boxes under another root) took
    the dead owner's lock, reaped only its own root and removed the lock, so the sweep that
    did share the owner's root then found an owner it could not tell and left its dirs. The
    lock file lists the owner's roots; any sweeper reaps them."""
    owner, held = start_owner(root, LOCAL)
    kill(int(held["watchdog"]))  # type: ignore[call-overload]
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    assert leftovers(held), "nothing leaked: the test shows nothing"
    elsewhere = tempfile.mkdtemp(prefix="vfray-test-reap-other-")
    try:
        run_next_owner(elsewhere, ["subprocess"])
    finally:
        shutil.rmtree(elsewhere, ignore_errors=True)
    assert wait_until_clean(held) == []
    assert not Path(_reap_lock(held)).exists()


def test_an_owners_lock_file_lists_its_roots(root: str) -> None:
    owner, held = start_owner(root, LOCAL)
    try:
        listed = Path(_reap_lock(held)).read_text().splitlines()
        assert f"root {os.path.abspath(root)}" in listed, listed
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    assert wait_until_clean(held) == []


def test_a_sweep_leaves_a_live_owner_alone(root: str) -> None:
    owner, held = start_owner(root, LOCAL)
    try:
        run_next_owner(root, LOCAL)
        still = leftovers(held)
        boxes = held["boxes"]
        assert isinstance(boxes, dict)
        for kind, box in boxes.items():
            assert f"{kind} dir {box['dir']}" in still
            assert {f"{kind} cgroup {c}" for c in box["cgroups"]} <= set(still)
        # A bwrap box's background process ends with its run (the namespace's init exits).
        assert any(s.startswith("subprocess process") for s in still), still
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    assert wait_until_clean(held) == []


def marked_parent_with_unmarked_child(token: str) -> tuple[subprocess.Popen[str], int]:
    """A process carrying ``token`` and its child that exec'd with an empty environment."""
    env = {**os.environ, _reap.OWNER_ENV: token}
    parent = subprocess.Popen(
        ["bash", "-c", "env -i sleep 600 & echo $!; wait"],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    while not Path(f"/proc/{child}/cmdline").read_bytes().startswith(b"sleep"):
        time.sleep(0.01)  # until the fork has exec'd with its empty environment
    return parent, child


def test_the_reaper_kills_a_marked_process_and_children_whose_environment_was_replaced() -> None:
    """Ray's agents rewrite their process title (and a program may exec with a clean
    environment): a process below a marked one goes with it even without the token."""
    token = os.urandom(16).hex()
    parent, child = marked_parent_with_unmarked_child(token)
    assert _reap.OWNER_ENV.encode() not in Path(f"/proc/{child}/environ").read_bytes()
    _reap.kill_processes(token)
    assert parent.wait(timeout=10) == -signal.SIGKILL
    for _ in range(200):  # the orphan is reaped by init once killed
        if not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text():
            break
        time.sleep(0.05)
    else:
        os.kill(child, signal.SIGKILL)
        raise AssertionError("the unmarked child outlived the reaper")


def _gone(pid: int) -> bool:
    return not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text()


def test_a_snapshot_kills_an_unmarked_child_whose_marked_parent_died_first() -> None:
    """Ray's raylet dies with its driver before the watchdog reaps, and its agents (titles
    written over their environment) are reparented: only the watchdog's snapshot, taken while
    the owner lived, still knows them. A PID whose start time changed is never killed."""
    token = os.urandom(16).hex()
    parent, child = marked_parent_with_unmarked_child(token)
    bystander = subprocess.Popen(["sleep", "600"])
    try:
        known = _reap.snapshot(token)
        assert set(known) == {parent.pid, child}
        parent.kill()  # the marked parent goes first: the child is orphaned and unmarked
        parent.wait()
        assert _reap.snapshot(token) == {}
        stale = {bystander.pid: "0"}  # a reused PID: its start time is not the one noted
        _reap.kill_processes(token, {**known, **stale})
        for _ in range(200):
            if _gone(child):
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the orphaned child outlived the reaper")
        assert bystander.poll() is None, "a PID whose start time changed was killed"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
        bystander.kill()
        bystander.wait()


def test_a_watchdog_noted_before_its_exec_is_spared_by_the_snapshot_kill() -> None:
    """A snapshot taken while a host's watchdog was between its fork and its exec saw the
    host's environment (the driver's token), so it noted the watchdog as the driver's: the
    driver's reaping must still spare it, or the host's containers outlive both (seen in CI:
    three containers left running after a driver's SIGKILL)."""
    token = os.urandom(16).hex()
    watchdog = subprocess.Popen(["sleep", "600"], env={_reap.WATCHDOG_ENV: os.urandom(16).hex()})
    try:
        started = None
        for _ in range(200):  # until the exec has put the watchdog's own mark in place
            if _reap.WATCHDOG_ENV.encode() in Path(f"/proc/{watchdog.pid}/environ").read_bytes():
                started = _reap._start_time(watchdog.pid)
                break
            time.sleep(0.01)
        assert started is not None
        _reap.kill_processes(token, {watchdog.pid: started})  # noted as the driver's
        assert watchdog.poll() is None, "the snapshot's kill took a watchdog with it"
    finally:
        watchdog.kill()
        watchdog.wait()


# A driver with a lifeline of its own, whose child (a "host") carries the driver's token in its
# environment, as a local Ray's workers do: the host starts boxes under its own lifeline.
DRIVER = """
import os, subprocess, sys
from vfray.runtimes import lifeline

env = {**os.environ, lifeline.OWNER_ENV: lifeline.owner_id()}
host = subprocess.Popen([sys.executable, "-c", *sys.argv[1:]], env=env)
host.wait()
"""


def _host_under_a_driver(
    root: str, kinds: list[str], docker: dict[str, object] | None = None
) -> tuple[subprocess.Popen[str], dict[str, object]]:
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, OWNER, root, ",".join(kinds), json.dumps(docker or {})],
        stdout=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    assert driver.stdout is not None
    line = driver.stdout.readline()
    if not line:
        driver.kill()
        raise AssertionError("the host did not start its boxes")
    held: dict[str, object] = json.loads(line)
    return driver, held


def _check_the_host_is_reaped_with_its_driver(
    driver: subprocess.Popen[str], held: dict[str, object], docker_url: str | None = None
) -> None:
    assert leftovers(held, docker_url), "the host holds nothing to reap"
    # A host lives long: by the time its driver dies, the driver's watchdog has noted the host's
    # tree (every SNAPSHOT_S), the host's watchdog included, and kills what it noted.
    time.sleep(2.5 * _reap.SNAPSHOT_S)
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    # The driver's watchdog kills the host (it carries the driver's token) but spares the
    # host's own watchdog, which then reaps the host's dirs, cgroups and containers.
    assert wait_until_clean(held, docker_url) == []


def test_a_hosts_watchdog_reaps_its_boxes_when_the_driver_above_it_is_killed(root: str) -> None:
    driver, held = _host_under_a_driver(root, LOCAL)
    _check_the_host_is_reaped_with_its_driver(driver, held)


def test_a_hosts_docker_containers_are_removed_when_the_driver_is_killed(
    root: str, docker_url: str
) -> None:
    from docker_engine import IMAGE, VOLUMES

    docker = {"url": docker_url, "image": IMAGE, "volumes": VOLUMES}
    driver, held = _host_under_a_driver(root, ["docker"], docker)
    _check_the_host_is_reaped_with_its_driver(driver, held, docker_url)


@pytest.mark.parametrize("end", ["handle dropped", "ray.kill"])
def test_a_ray_actors_running_boxes_are_reaped_however_it_ends(
    root: str, ray_local: None, end: str
) -> None:
    """Ray kills an actor's direct children when the actor exits gracefully
    (``RAY_kill_child_processes_on_worker_exit``, on by default), and the lifeline's watchdog
    was one of them: a SandboxHost that ended with boxes running (its handle dropped, its job
    done, ``ray.shutdown()`` with no farm close) left their processes, dirs, cgroups and
    network namespaces behind. The watchdog now forks off the owner's tree. ``ray.kill``
    (SIGKILL, no child killing) was reaped before too."""
    import ray

    @ray.remote(num_cpus=0)
    class Host:
        async def start(self, root: str, kinds: list[str]) -> dict[str, object]:
            from vfray.runtimes.base import RuntimeSpec
            from vfray.runtimes.registry import make_runtime

            held: dict[str, object] = {"boxes": {}, "pid": os.getpid()}
            spec = RuntimeSpec(memory_gb=0.5, cpu=1.0, pids=256)
            for kind in kinds:
                runtime = make_runtime(kind, spec, root=root)
                await runtime.start()
                ran = await runtime.run(
                    ["sh", "-c", "nohup sleep 300 >/dev/null 2>&1 & echo started"], timeout=60
                )
                assert ran.ok, ran
                cgroup = getattr(runtime, "cgroup", None)
                held["boxes"][kind] = {  # type: ignore[index]
                    "box_id": runtime.box_id,
                    "dir": str(getattr(runtime, "base", None) or runtime.workdir),
                    "cgroups": [str(d) for d in cgroup.dirs] if cgroup else [],
                    "container": None,
                }
            return held

    # Its lock file where no other test's box start sweeps (see OWNERS_TMP): only its own
    # watchdog can reap it. A worker of its own, as its environment differs.
    env = {"env_vars": {"TMPDIR": OWNERS_TMP}}
    host = Host.options(runtime_env=env).remote()  # type: ignore[attr-defined]
    held = ray.get(host.start.remote(root, LOCAL), timeout=120)
    assert leftovers(held), "the actor holds nothing to reap"
    if end == "ray.kill":
        ray.kill(host)
    del host  # the last handle: Ray ends the actor gracefully, as at a job's end
    assert _wait_gone(int(held["pid"]), timeout=60), "Ray did not end the actor"  # type: ignore[call-overload]
    assert wait_until_clean(held) == []
