"""A real Ray head for tests that drive Ray's CLI: started with ``ray start --head`` on
127.0.0.1, in its own temp dir and on free ports, with token auth on and a token file of its
own; stopped by the PIDs it started (never ``ray stop``, which would stop every Ray here)."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """``count`` distinct free loopback ports: every socket stays bound until all are picked,
    so the kernel cannot hand the same port out twice (one head's GCS and client server once
    got the same port from back-to-back single picks, and ``ray start`` refused it)."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            s = stack.enter_context(socket.socket())
            s.bind(("127.0.0.1", 0))
            ports.append(int(s.getsockname()[1]))
        return ports


def ray_cli() -> str:
    beside = Path(sys.executable).parent / "ray"
    found = str(beside) if beside.exists() else shutil.which("ray")
    if found is None:
        pytest.skip("the ray command is not installed")
    return found


def is_loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip.split("%")[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def _processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line), read from /proc."""
    found: dict[int, tuple[int, str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name in stat may contain spaces; the parent pid follows its ")".
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        found[int(entry.name)] = (ppid, cmdline)
    return found


def processes_of(*markers: str) -> set[int]:
    """Processes whose command line names one of ``markers`` (our temp dir, our GCS address),
    and all their descendants (Ray workers rename themselves ``ray::…`` and lose the marker)."""
    table = _processes()
    ours = {
        pid
        for pid, (_, cmd) in table.items()
        if any(m in cmd for m in markers) and pid != os.getpid()
    }
    grew = True
    while grew:
        children = {pid for pid, (ppid, _) in table.items() if ppid in ours} - ours
        grew = bool(children)
        ours |= children
    return ours


def _alive(pid: int) -> bool:
    """Running, not a zombie: a dead daemon of the head stays in /proc until PID 1 reaps it
    (seconds here), and it needs no more signals."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def kill_all(pids: set[int]) -> None:
    """SIGTERM, then SIGKILL what is left after a short grace: a test's head has nothing to
    save, and its gcs_server and autoscaler monitor took 10 s to answer a SIGTERM here."""
    for sig, grace in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 10.0)):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.1)
        pids = {p for p in pids if _alive(p)}
        if not pids:
            return


@dataclass(frozen=True)
class Head:
    markers: tuple[str, ...]
    dashboard: str
    token: str
    env: dict[str, str]
    """The environment for ``ray`` commands against this head (token auth on, its token)."""

    def listeners(self) -> set[tuple[str, str, int]]:
        """(command, ip, port) of every LISTEN socket of the head's processes."""
        found = set()
        for pid in processes_of(*self.markers):
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(pid)
                cmd = " ".join(proc.cmdline())[:120]
                for conn in proc.net_connections(kind="inet"):
                    if conn.status == psutil.CONN_LISTEN:
                        found.add((cmd, conn.laddr.ip, conn.laddr.port))
        return found


@contextlib.contextmanager
def ray_head(
    python: str | None = None,
    *,
    keep_pythonpath: bool = True,
    extra_env: dict[str, str] | None = None,
) -> Iterator[Head]:
    """A head node on loopback with a dashboard (the job API) and token auth on, started with
    ``python``'s Ray (its workers run that Python) or the ``ray`` command beside this one's;
    ``extra_env`` is set for the head's processes (and so its jobs' drivers)."""
    temp_dir = tempfile.mkdtemp(prefix="vfrj", dir="/tmp")  # short: unix socket paths
    token = secrets.token_hex(32)
    token_file = Path(temp_dir) / "auth_token"
    token_file.touch(mode=0o600)
    token_file.write_text(token)
    dropped = ("RAY_ADDRESS", "RAY_AUTH", "VFRAY_") + (() if keep_pythonpath else ("PYTHONPATH",))
    env = {k: v for k, v in os.environ.items() if not k.startswith(dropped)}
    # The token in a file (what a user keeps, rather than a variable in their shell history).
    env.update(
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN_PATH=str(token_file),
        RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
    )
    env.update(extra_env or {})
    flags = (
        "--port", "--dashboard-port", "--ray-client-server-port", "--dashboard-agent-listen-port",
        "--dashboard-agent-grpc-port", "--metrics-export-port", "--runtime-env-agent-port",
    )  # fmt: skip
    ports = dict(zip(flags, free_ports(len(flags)), strict=True))
    dashboard = ports["--dashboard-port"]
    # Ray's client server names neither the temp dir nor a parent of ours: its GCS address.
    markers = (temp_dir, f"127.0.0.1:{ports['--port']}")
    command = (
        [python, "-c", "from ray.scripts.scripts import main; main()"] if python else [ray_cli()]
    )
    argv = [
        *command, "start", "--head", "--node-ip-address=127.0.0.1", f"--temp-dir={temp_dir}",
        "--num-cpus=2", "--include-dashboard=true", "--dashboard-host=127.0.0.1",
        "--disable-usage-stats", *(f"{flag}={port}" for flag, port in ports.items()),
    ]  # fmt: skip
    try:
        # cwd: nothing importable from where the test runs leaks into the head's processes.
        for _attempt in range(2):
            started = subprocess.run(
                argv,
                env=env,
                cwd=temp_dir,
                capture_output=True,
                text=True,
                timeout=180,
                check=False,
            )
            # Ray waits a fixed 30 s for its raylet to register: on a 2-core machine busy with
            # the other test worker's installs one start ran past it. Once more, from scratch.
            if started.returncode == 0 or "timed out during startup" not in started.stderr:
                break
            kill_all(processes_of(*markers))
        assert started.returncode == 0, started.stdout[-3000:] + started.stderr[-3000:]
        yield Head(markers, f"http://127.0.0.1:{dashboard}", token, env)
    finally:
        kill_all(processes_of(*markers))
        shutil.rmtree(temp_dir, ignore_errors=True)
