"""vfray.runtimes without a box engine: runtime lookup and typed options (every bad option a
one-line ConfigError naming it), the scrubbed box environment, process-group runs of real
programs (missing, not executable, fed stdin, cut to the output cap, killed at the timeout), the
subprocess box's errors before and after its life, and the docker and bwrap option mappings
(container arguments, network rule, host paths) that need no daemon to check."""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from vfray.errors import ConfigError, SandboxError
from vfray.runtimes import _bwrap_args, bwrap, live, processes
from vfray.runtimes._exec_wait import tail
from vfray.runtimes.base import ProgramResult, Runtime, RuntimeSpec
from vfray.runtimes.docker import DEFAULT_ENGINE, DEFAULT_IMAGE, DockerRuntime
from vfray.runtimes.launches import Launch, launch_slots
from vfray.runtimes.registry import (
    OpenRuntimeOptions,
    make_runtime,
    options_type,
    runtime_class,
    runtime_options,
    task_spec,
)
from vfray.runtimes.subprocess import SubprocessRuntime
from vfray.task import TaskData

# --- lookup and typed options -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "options", "message"),
    [
        (
            "subprocess",
            {"cpu_seconds": "lots"},
            "bad options for runtime 'subprocess': cpu_seconds: Input should be a valid integer",
        ),
        (
            "subprocess",
            {"bogus": 1},
            "bad options for runtime 'subprocess': bogus: Extra inputs are not permitted",
        ),
        ("bwrap", {"share_network": "maybe"}, "share_network: Input should be a valid boolean"),
        ("bwrap", {"ro_binds": 5}, "ro_binds: "),
        ("docker", {"volumes": ["/a"]}, "volumes: Input should be a valid dictionary"),
        ("docker", {"output_cap": "big", "nope": 1}, "output_cap: .*; nope: Extra inputs"),
        ("modal", {"sandbox_timeout": "soon"}, "bad options for runtime 'modal': sandbox_timeout"),
    ],
)
def test_bad_runtime_options_are_one_line_naming_the_option(
    kind: str, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        runtime_options(kind, options)
    assert "\n" not in str(info.value)


def test_runtime_options_are_typed_from_the_constructor_and_keep_only_what_was_set() -> None:
    typed = runtime_options("subprocess", {"cpu_seconds": "5"})
    assert typed.cpu_seconds == 5  # type: ignore[attr-defined]
    fields = set(options_type(runtime_class("bwrap")).model_fields)
    assert {"share_network", "ro_binds", "use_cgroups", "launch_concurrency"} <= fields
    assert "spec" not in fields  # the spec is the runtime's, not an option
    docker = set(options_type(runtime_class("docker")).model_fields)
    assert docker == {
        "base_url",
        "default_image",
        "share_network",
        "volumes",
        "python",
        "output_cap",
        "user",
        "max_builds",
        "build_network",
    }


PLUGIN = """
from vfray.runtimes.subprocess import SubprocessRuntime


class Roomy(SubprocessRuntime):
    type = "roomy"

    def __init__(self, spec=None, *, size: int = 1, **options):
        super().__init__(spec)
        self.size = size
        self.extra = options


class NotARuntime:
    pass
"""


def test_a_runtime_plugin_by_file_path_with_open_options(tmp_path: Path) -> None:
    (tmp_path / "boxes.py").write_text(PLUGIN)
    spec = f"{tmp_path}/boxes.py:Roomy"
    cls = runtime_class(spec)
    assert cls.type == "roomy" and issubclass(cls, SubprocessRuntime)
    typed = runtime_options(spec, {"size": "3", "colour": "blue"})
    assert isinstance(typed, OpenRuntimeOptions)
    assert typed.as_kwargs() == {"size": 3, "colour": "blue"}  # unknown keys kept for **options
    runtime = make_runtime(spec, None, **typed.as_kwargs())
    assert (runtime.size, runtime.extra) == (3, {"colour": "blue"})  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match=r"size: Input should be a valid integer"):
        runtime_options(spec, {"size": "x"})
    with pytest.raises(ConfigError, match=r"boxes.py:NotARuntime' is not a vfray runtime"):
        runtime_class(f"{tmp_path}/boxes.py:NotARuntime")


@pytest.mark.parametrize(
    ("name", "match"),
    [
        ("firecracker", r"unknown runtime 'firecracker'; known: .*'mypkg.boxes:MyRuntime'"),
        ("json:dumps", r"'json:dumps' is not a vfray runtime"),
        ("no_such_mod_q:Box", r"cannot import module 'no_such_mod_q'"),
        ("/nowhere/boxes.py:Box", r"plugin file '/nowhere/boxes.py' does not exist"),
    ],
)
def test_a_runtime_that_cannot_be_found_is_one_line(name: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        runtime_class(name)


def test_a_preflight_with_options_the_constructor_refuses_names_the_runtime() -> None:
    with pytest.raises(ConfigError, match=r"bad options for runtime 'docker': .*'colour'"):
        DockerRuntime.preflight({"colour": "red"})


def test_a_runtime_spec_comes_from_the_tasks_data() -> None:
    data = TaskData(
        prompt="p",
        image="alpine:3",
        workdir="/srv",
        resources={"cpu": 2.5, "memory": 3.0},
        network_allow=["pypi.org"],
        network_block=["10.0.0.0/8"],
    )
    spec = task_spec(data)
    assert spec == RuntimeSpec(
        image="alpine:3",
        workdir="/srv",
        cpu=2.5,
        memory_gb=3.0,
        network_allow=("pypi.org",),
        network_block=("10.0.0.0/8",),
    )
    assert spec.pids == 512  # the default fork-bomb bound, not the task's to lift
    assert task_spec(TaskData(prompt="p")).network_allow == ("*",)


@pytest.mark.parametrize(
    ("result", "ok"),
    [
        (ProgramResult(exit_code=0), True),
        (ProgramResult(exit_code=1), False),
        (ProgramResult(exit_code=0, timed_out=True), False),
        (ProgramResult(exit_code=-9), False),
    ],
)
def test_a_program_is_ok_when_it_exited_zero_in_time(result: ProgramResult, ok: bool) -> None:
    assert result.ok is ok


# --- the box environment ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("OPENAI_API_KEY", True),
        ("openai_api_key", True),
        ("MY_APIKEY", True),
        ("GITHUB_TOKEN", True),
        ("DB_PASSWORD", True),
        ("AWS_REGION", True),  # every AWS_* goes: the region names the account's reach
        ("HF_HOME", True),
        ("RAY_ADDRESS", True),
        ("SSH_AUTH_SOCK", True),
        ("GOOGLE_APPLICATION_CREDENTIALS", True),
        ("PROXY_AUTHORIZATION", True),
        ("PATH", False),
        ("LANG", False),
        ("TOKENIZERS_PARALLELISM", True),  # contains TOKEN: dropped, like any lookalike
        ("HOME", False),
    ],
)
def test_which_variables_count_as_secrets(name: str, secret: bool) -> None:
    assert processes.is_secret(name) is secret


def test_a_box_inherits_only_the_kept_variables_and_gets_its_own() -> None:
    host = {
        "PATH": "/opt/bin:/usr/bin",
        "TERM": "xterm",
        "OPENAI_API_KEY": "sk-x",
        "HOME": "/root",
        "PYTHONPATH": "/src",
        "VIRTUAL_ENV": "/venv",
    }
    env = processes.box_env(host, "/box/work", "box1", {"ROLLOUT": "r", "TERM": "dumb"}, owner="o")
    assert env == {
        "PATH": "/opt/bin:/usr/bin",
        "TERM": "dumb",  # the caller's own variables win
        "LANG": "C.UTF-8",
        "HOME": "/box/work",
        processes.MARKER_ENV: "box1",
        "VFRAY_OWNER_ID": "o",
        "ROLLOUT": "r",
    }
    bare = processes.box_env({}, "/w", "b")
    assert bare["PATH"] == "/usr/local/bin:/usr/bin:/bin" and "VFRAY_OWNER_ID" not in bare


def test_a_networked_box_gets_the_hosts_proxies_and_tls_roots(tmp_path: Path) -> None:
    bundle = tmp_path / "roots.pem"
    bundle.write_text("")
    host = {
        "https_proxy": "http://proxy:3128",
        "NO_PROXY": "localhost",
        "HTTP_PROXY": "",  # empty: not passed on
        "SSL_CERT_FILE": str(bundle),
        "SSL_CERT_DIR": "/etc/certs",
        "OPENAI_API_KEY": "sk-x",
    }
    assert processes.network_env(host) == {
        "https_proxy": "http://proxy:3128",
        "NO_PROXY": "localhost",
        "SSL_CERT_FILE": str(bundle),
        "NODE_EXTRA_CA_CERTS": str(bundle),
        "REQUESTS_CA_BUNDLE": str(bundle),
        "SSL_CERT_DIR": "/etc/certs",
    }
    # A box with its own filesystem (a container) keeps its own roots.
    assert processes.network_env(host, host_paths=False) == {
        "https_proxy": "http://proxy:3128",
        "NO_PROXY": "localhost",
    }


def test_the_output_tail_keeps_the_end_and_says_it_cut() -> None:
    tail = processes._TailBuffer(8)
    tail.add(b"0123")
    assert (tail.text(), tail.truncated) == ("0123", False)
    tail.add(b"456789ab")
    assert (tail.text(), tail.truncated) == ("456789ab", True)
    cut = processes._TailBuffer(3)
    cut.add("é!".encode())  # a cut through a character decodes, replaced
    assert cut.text() == "é!"
    cut.add(b"xy")
    assert cut.text() == "!xy"


def test_no_limits_means_no_preexec_hook_at_all(monkeypatch: pytest.MonkeyPatch) -> None:
    assert processes.rlimit_setter(None, None, None) is None
    assert callable(processes.rlimit_setter(1.0, None, None))
    assert callable(processes.rlimit_setter(None, 10, None))


def test_descendants_include_a_grandchild() -> None:
    async def run() -> list[int]:
        proc = await asyncio.create_subprocess_exec(
            "sh", "-c", "sleep 30 & echo $!; wait", stdout=asyncio.subprocess.PIPE
        )
        assert proc.stdout is not None
        grandchild = int((await proc.stdout.readline()).decode())
        try:
            found = live.descendants(proc.pid)
            assert found[0] == proc.pid
            assert grandchild in found
            # Read down the subtree's children files: the same as the walk of all of /proc.
            assert sorted(found) == sorted(live._descendants_by_walk(proc.pid))
        finally:
            processes.kill_pids(live.descendants(proc.pid))
            await proc.wait()
        processes.kill_pids([grandchild])  # gone already: no error
        processes.kill_group(2**22 + 1)  # no such group: no error
        return found

    assert len(asyncio.run(run())) >= 2


def test_descendants_include_a_child_forked_by_another_thread() -> None:
    """A child is listed under the thread that forked it (while that thread lives), not under
    the process's main one."""
    started: list[subprocess.Popen[bytes]] = []
    forked, done = threading.Event(), threading.Event()

    def fork() -> None:
        started.append(subprocess.Popen(["sleep", "30"]))
        forked.set()
        done.wait(30)

    forker = threading.Thread(target=fork)
    forker.start()
    forked.wait(30)
    try:
        assert started[0].pid in live.descendants(os.getpid())
    finally:
        done.set()
        forker.join()
        started[0].kill()
        started[0].wait()


# --- process-group runs of real programs --------------------------------------------------------


async def _run(argv: list[str], tmp: Path, **kw: Any) -> ProgramResult:
    started: list[int] = []
    kw.setdefault("timeout", 60)
    kw.setdefault("stdin", None)
    result = await processes.run_process_group(
        argv, {"PATH": os.environ["PATH"]}, str(tmp), preexec_fn=None, on_start=started.append, **kw
    )
    return result


async def test_a_missing_program_exits_127_like_a_shell(tmp_path: Path) -> None:
    result = await _run(["/no/such/program", "x"], tmp_path)
    assert (result.exit_code, result.ok) == (127, False)
    assert result.stderr.startswith("/no/such/program: No such file or directory")


async def test_a_program_that_is_not_executable_exits_126(tmp_path: Path) -> None:
    script = tmp_path / "plain.sh"
    script.write_text("echo hi\n")
    script.chmod(stat.S_IRUSR | stat.S_IWUSR)
    result = await _run([str(script)], tmp_path)
    assert result.exit_code == 126 and "Permission denied" in result.stderr


async def test_a_bad_working_dir_is_a_sandbox_error(tmp_path: Path) -> None:
    # The program is there; its working dir is not: that is the box's fault, not the program's.
    with pytest.raises(SandboxError, match=r"cannot start 'true': work dir .*gone is gone"):
        await processes.run_process_group(
            ["true"],
            {"PATH": os.environ["PATH"]},
            str(tmp_path / "gone"),
            timeout=5,
            stdin=None,
            preexec_fn=None,
            on_start=lambda pgid: None,
        )


async def test_stdin_is_fed_and_output_is_captured_in_the_working_dir(tmp_path: Path) -> None:
    code = "import os, sys; print(sys.stdin.read().upper(), os.getcwd()); sys.exit(3)"
    result = await _run([sys.executable, "-c", code], tmp_path, stdin=b"ping")
    assert result.exit_code == 3 and not result.timed_out
    assert result.stdout == f"PING {tmp_path}\n"


async def test_a_flood_keeps_only_the_tail_of_each_stream(tmp_path: Path) -> None:
    code = "import sys\nsys.stdout.write('x' * 5000 + 'END')\nsys.stderr.write('e' * 10 + 'ERR')\n"
    result = await _run([sys.executable, "-c", code], tmp_path, output_cap=100)
    assert result.truncated
    assert len(result.stdout) == 100 and result.stdout.endswith("xEND")
    assert result.stderr == "e" * 10 + "ERR"  # under the cap: whole


async def test_a_timeout_kills_the_whole_group(tmp_path: Path) -> None:
    # The child writes its grandchild's pid, then both sleep: both must be gone after.
    code = "sleep 60 & echo $! > grandchild; wait"
    result = await _run(["sh", "-c", code], tmp_path, timeout=0.5)
    assert result.timed_out and not result.ok and result.exit_code < 0
    pid = int((tmp_path / "grandchild").read_text())
    for _ in range(200):
        if not Path(f"/proc/{pid}").exists() or "Z" in _state(pid):
            break
        await asyncio.sleep(0.01)
    assert not Path(f"/proc/{pid}").exists() or "Z" in _state(pid)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


async def test_a_program_whose_daemon_keeps_the_pipe_open_still_returns(tmp_path: Path) -> None:
    # The daemon holds stdout; the run returns once the program itself exits.
    groups: list[int] = []
    result = await processes.run_process_group(
        ["sh", "-c", "(sleep 30 &) ; echo done"],
        {"PATH": os.environ["PATH"]},
        str(tmp_path),
        timeout=60,
        stdin=None,
        preexec_fn=None,
        on_start=groups.append,
    )
    assert result.ok and result.stdout == "done\n"
    assert result.duration < 30
    processes.kill_group(groups[0])  # what the box's stop does with the daemon
    await asyncio.sleep(0.2)  # its pipe's transport sees the end on this loop


async def test_launch_slots_are_shared_per_size_and_zero_means_none() -> None:
    assert launch_slots(0) is None
    first, again, other = launch_slots(3), launch_slots(3), launch_slots(4)
    assert first is again and first is not other
    launch = Launch(first, signals_ready=True)
    await launch.acquire()
    assert launch.write_fd >= 0
    assert launch.child_env({}) == {"VFRAY_READY_FD": str(launch.write_fd)}
    launch.release()
    launch.release()  # idempotent: the slot is given back once
    assert first is not None and first._value == 3
    unthrottled = Launch(None, signals_ready=True)
    await unthrottled.acquire()
    assert unthrottled.write_fd == -1 and unthrottled.child_env({}) == {}


# --- the subprocess box's life ------------------------------------------------------------------


async def test_a_subprocess_box_refuses_use_before_start_and_after_stop(tmp_path: Path) -> None:
    box = SubprocessRuntime(root=str(tmp_path))
    assert not await box.alive()
    with pytest.raises(SandboxError, match="subprocess runtime is not started"):
        await box.read("x")
    await box.start()
    try:
        assert await box.alive()
        assert box.workdir is not None and box.workdir.parent == tmp_path
        await box.write("deep/er/file.sh", b"echo hi\n", mode=0o755)
        target = box.resolve("deep/er/file.sh")
        assert stat.S_IMODE(target.stat().st_mode) == 0o755
        assert await box.read("deep/er/file.sh") == b"echo hi\n"
        with pytest.raises(SandboxError, match=r"cannot read 'missing\.txt'"):
            await box.read("missing.txt")
        assert await box.expose(8123) == "http://127.0.0.1:8123"
        assert await box.host_url("http://127.0.0.1:9/v1") == "http://127.0.0.1:9/v1"
        result = await box.run(["sh", "-c", 'echo "$HOME" "$VFRAY_BOX_ID"'], timeout=30)
        assert result.stdout.split() == [str(box.workdir), box.box_id]
    finally:
        await box.stop()
    await box.stop()  # idempotent
    assert not await box.alive() and not box.workdir.exists()
    with pytest.raises(SandboxError, match="not started"):
        await box.write("x", b"")
    with pytest.raises(SandboxError, match="not started"):
        await box.expose(1)


class _Bare(Runtime):
    """A runtime with only what the contract requires."""

    type = "bare"

    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def run(
        self, argv: Any, env: Any = None, *, timeout: Any = None, stdin: Any = None
    ) -> Any:
        return ProgramResult(exit_code=0, stdout=" ".join(argv))

    async def read(self, path: str) -> bytes:
        return b""

    async def write(self, path: str, data: bytes, *, mode: int = 0o644) -> None: ...
    async def host_url(self, url: str) -> str:
        return url

    async def alive(self) -> bool:
        return True


async def test_a_runtime_without_live_processes_or_ports_says_so_by_name() -> None:
    async with _Bare() as box:
        with pytest.raises(SandboxError, match="the bare runtime cannot open live processes"):
            await box.open_process(["sh"])
        with pytest.raises(SandboxError, match="the bare runtime cannot open live processes"):
            await box.run_background(["sh"])
        with pytest.raises(SandboxError, match="the bare runtime cannot expose box ports"):
            await box.expose(80)
        # The harness program runs like any command unless a runtime says otherwise.
        assert (await box.run_program(["echo", "hi"], signals_ready=True)).stdout == "echo hi"
        assert box.spec == RuntimeSpec()


# --- docker and bwrap mappings ------------------------------------------------------------------


def _docker(tmp_path: Path, spec: RuntimeSpec | None = None, **options: Any) -> DockerRuntime:
    runtime = DockerRuntime(spec, **options)
    runtime.base = tmp_path  # what start() makes before it asks for a container
    return runtime


def test_a_container_gets_the_tasks_limits_and_no_network_by_default(tmp_path: Path) -> None:
    spec = RuntimeSpec(cpu=0.5, memory_gb=1.5, pids=64)
    runtime = _docker(tmp_path, spec, volumes={"/data": "/mnt/data"})
    options = runtime.container_options()
    assert runtime.image == DEFAULT_IMAGE
    assert (options["entrypoint"], options["command"], options["detach"]) == (
        ["sleep"],
        ["infinity"],
        True,
    )
    assert options["working_dir"] == "/work"
    assert options["environment"] == {"VFRAY_BOX_ID": runtime.box_id, "HOME": "/work"}
    assert options["labels"] == {"vfray.box": runtime.box_id}  # no owner yet: no owner label
    assert (options["nano_cpus"], options["mem_limit"], options["pids_limit"]) == (
        500_000_000,
        "1536m",
        64,
    )
    assert options["network_mode"] == "none"
    volumes = options["volumes"]
    assert volumes[str(tmp_path / "bridge")] == {"bind": _bwrap_args.BRIDGE_DIR, "mode": "rw"}
    assert volumes["/data"] == {"bind": "/mnt/data", "mode": "ro"}


def test_unset_limits_are_left_to_the_engine(tmp_path: Path) -> None:
    spec = RuntimeSpec(image="alpine:3", workdir="/srv", cpu=0, memory_gb=None, pids=None)
    options = _docker(tmp_path, spec).container_options()
    for key in ("nano_cpus", "mem_limit", "pids_limit"):
        assert key not in options
    assert options["working_dir"] == "/srv" and options["environment"]["HOME"] == "/srv"
    assert _docker(tmp_path, spec, default_image="ignored").image == "alpine:3"


@pytest.mark.parametrize(
    ("allow", "share", "shared"),
    [
        (("*",), None, False),  # the default: no network (bridged host endpoints only)
        (("*",), True, True),
        (("pypi.org",), None, False),  # named hosts: through the node's egress proxy
        (("pypi.org",), True, False),
        (("pypi.org",), False, False),  # the option wins
        ((), None, False),
    ],
)
def test_the_network_rule_of_docker_and_bwrap(
    tmp_path: Path, allow: tuple[str, ...], share: bool | None, shared: bool
) -> None:
    spec = RuntimeSpec(network_allow=allow)
    assert bwrap.shares_network(spec, share) is shared
    options = _docker(tmp_path, spec, share_network=share).container_options()
    assert ("network_mode" not in options) is shared


def test_a_container_with_network_gets_the_hosts_proxies_but_not_its_cert_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy:3128")
    monkeypatch.setenv("SSL_CERT_FILE", "/host/only/roots.pem")
    assert _docker(tmp_path)._network_env() == {}
    shared = _docker(tmp_path, share_network=True)._network_env()
    assert shared["HTTPS_PROXY"] == "http://proxy:3128" and "SSL_CERT_FILE" not in shared


def test_owned_containers_carry_the_owner_and_host_labels(tmp_path: Path) -> None:
    import socket

    runtime = _docker(tmp_path)
    runtime.owner = "tok"
    labels = runtime.labels()
    assert labels["vfray.box"] == runtime.box_id
    assert set(labels.values()) >= {"tok", socket.gethostname()}
    assert len(labels) == 3


def test_the_engine_url_is_the_option_then_docker_host_then_the_socket(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    assert DockerRuntime().engine_url() == DEFAULT_ENGINE
    monkeypatch.setenv("DOCKER_HOST", "tcp://10.0.0.5:2375")
    assert DockerRuntime().engine_url() == "tcp://10.0.0.5:2375"
    assert DockerRuntime(base_url="unix:///tmp/d.sock").engine_url() == "unix:///tmp/d.sock"


def test_a_docker_engine_that_does_not_answer_is_one_line_naming_it() -> None:
    pytest.importorskip("docker")
    import socket

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(ConfigError) as info:
        DockerRuntime.preflight({"base_url": f"tcp://127.0.0.1:{port}"})
    message = str(info.value)
    assert message.startswith(f"docker runtime: no Docker daemon at tcp://127.0.0.1:{port} (")
    assert "--env.runtime.options.base_url" in message and "\n" not in message


@pytest.mark.parametrize(
    ("data", "cap", "text", "cut"),
    [
        (None, 10, "", False),
        (b"short", 10, "short", False),
        (b"0123456789abc", 10, "3456789abc", True),
        (b"\xff\xfeok", 10, "\ufffd\ufffdok", False),
    ],
)
def test_container_output_is_cut_to_its_tail(
    data: bytes | None, cap: int, text: str, cut: bool
) -> None:
    assert tail(data, cap) == (text, cut)


def test_bwrap_mounts_the_interpreter_outer_paths_first() -> None:
    paths = _bwrap_args.host_paths(["/nonexistent-extra", "/usr/share", "/tmp"])
    assert "/tmp" in paths and "/nonexistent-extra" not in paths
    assert not any(p == "/usr" or p.startswith(("/usr/", "/etc/")) for p in paths)
    depths = [p.count("/") for p in paths]
    assert depths == sorted(depths)  # a nested path is mounted on top of its parent
    real = os.path.dirname(os.path.realpath(sys.executable))
    if not real.startswith("/usr/"):
        assert real in paths


def test_bwrap_boxes_see_only_the_listed_etc_entries_this_host_has() -> None:
    entries = _bwrap_args.box_etc()
    assert set(entries) <= set(_bwrap_args.ETC_ENTRIES)
    assert all(os.path.lexists(f"/etc/{name}") for name in entries)
    for private in ("shadow", "gshadow", "sudoers", "passwd", "group"):
        assert private not in _bwrap_args.ETC_ENTRIES
