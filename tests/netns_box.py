"""A "remote" box for tests: a network namespace that can reach one address only — the host
side of a veth pair, where the test's own sshd listens — and a runtime whose programs run in it
(``REMOTE``: they reach the interception through the node's tunnel). Needs root and iproute2."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from vfray.runtimes.base import RuntimeSpec
from vfray.runtimes.subprocess import SubprocessRuntime


class NetnsRuntime(SubprocessRuntime):
    """The subprocess runtime, its programs run inside network namespace ``netns``."""

    type = "netns"
    REMOTE: ClassVar[bool] = True

    def __init__(self, spec: RuntimeSpec | None = None, *, netns: str, **options: Any) -> None:
        super().__init__(spec, **options)
        self.netns = netns

    async def _run(  # type: ignore[override]
        self, argv: Sequence[str], env: Mapping[str, str] | None, **kw: Any
    ) -> Any:
        return await super()._run(["ip", "netns", "exec", self.netns, *argv], env, **kw)


@dataclass
class Island:
    """A namespace whose only reachable address is ``gateway`` (this host's end of a veth),
    and an sshd listening there on ``ssh_port`` that allows remote forwards."""

    netns: str
    gateway: str
    ssh_port: int
    key: str
    sshd_log: Path

    def accepted(self) -> int:
        """SSH connections sshd accepted (each tunnel is one)."""
        return self.sshd_log.read_text(errors="replace").count("Accepted publickey")

    def tunnel_options(self) -> dict[str, Any]:
        return {
            "host": self.gateway,
            "user": "root",
            "port": self.ssh_port,
            "identity_file": self.key,
            "bind_address": self.gateway,
            "ssh_options": ["StrictHostKeyChecking=no", "UserKnownHostsFile=/dev/null"],
        }


def _sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


def _free_port(host: str) -> int:
    import socket

    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def island() -> Iterator[Island]:
    tag = uuid.uuid4().hex[:6]
    ns, host_end, box_end = f"vfns-{tag}", f"vfh{tag}", f"vfb{tag}"
    octet = int(tag[:2], 16) % 200 + 20
    gateway, box_ip = f"10.213.{octet}.1", f"10.213.{octet}.2"
    temp = Path(tempfile.mkdtemp(prefix="vfray-island-"))
    sshd: subprocess.Popen[bytes] | None = None
    _sh("ip", "netns", "add", ns)
    try:
        _sh("ip", "link", "add", host_end, "type", "veth", "peer", "name", box_end)
        _sh("ip", "link", "set", box_end, "netns", ns)
        _sh("ip", "addr", "add", f"{gateway}/30", "dev", host_end)
        _sh("ip", "link", "set", host_end, "up")
        _sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{box_ip}/30", "dev", box_end)
        _sh("ip", "netns", "exec", ns, "ip", "link", "set", box_end, "up")
        _sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        key = temp / "id"
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key))
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(temp / "host"))
        shutil.copy(f"{key}.pub", temp / "authorized_keys")
        port = _free_port(gateway)
        (temp / "sshd_config").write_text(
            f"Port {port}\nListenAddress {gateway}\nHostKey {temp}/host\n"
            f"AuthorizedKeysFile {temp}/authorized_keys\nPidFile {temp}/sshd.pid\n"
            "PermitRootLogin prohibit-password\nPasswordAuthentication no\nUsePAM no\n"
            "StrictModes no\nGatewayPorts clientspecified\nAllowTcpForwarding remote\n"
            # A session whose client was killed (the tunnel-restart test) ends within seconds.
            "LogLevel VERBOSE\nClientAliveInterval 2\nClientAliveCountMax 2\n"
        )
        Path("/run/sshd").mkdir(exist_ok=True)
        log = temp / "sshd.log"
        sshd = subprocess.Popen(
            ["/usr/sbin/sshd", "-D", "-e", "-f", str(temp / "sshd_config")],
            stderr=log.open("wb"),
        )
        deadline = time.monotonic() + 10
        while "listening on" not in log.read_text(errors="replace"):
            if sshd.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"sshd did not start: {log.read_text(errors='replace')}")
            time.sleep(0.05)
        yield Island(ns, gateway, port, str(key), log)
    finally:
        if sshd is not None:
            sshd.terminate()
            sshd.wait(timeout=10)
        with contextlib.suppress(subprocess.CalledProcessError):
            _sh("ip", "link", "del", host_end)
        _sh("ip", "netns", "del", ns)
        shutil.rmtree(temp, ignore_errors=True)
