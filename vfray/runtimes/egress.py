"""The node's egress proxy: how a box with no network of its own reaches the hosts its policy
(:mod:`vfray.runtimes.network_policy`) admits, and nothing else.

Each box gets a gate: a unix socket in its bridge dir, served by this process, that speaks HTTP
proxy (``CONNECT host:port`` for TLS and anything else, plain ``GET http://…`` requests).
Inside the box the bridge's forwarder (:data:`vfray.runtimes.bridge.BOX_FORWARDER`) listens on
``127.0.0.1:3128`` (:data:`EGRESS_PORT`) and passes each connection to the gate, and the box's
programs get ``HTTP(S)_PROXY`` pointing there (pip, npm, curl, uv, git over https honour it) and
``APT_CONFIG`` naming a file with ``Acquire::http(s)::Proxy``. Every request is checked against
the gate's current policy after resolving its host once, and connected to the address checked
(no second lookup to rebind). :meth:`EgressGate.enter_agent_phase` swaps the setup policy for
the agent's and cuts the tunnels setup opened. A gate is a bridge of its box: it closes with the
box's bridges at ``stop``; the proxy is only this process's gates, so it stops with its owner.

Measured before choosing (``benchmarks/egress.py``: a bwrap box, an HTTP server in a network
namespace behind a veth; two runs on this 2-core VM while other work ran, load average 8-10):

=========================================  ==================  ==================
                                           direct (no filter)  this proxy
=========================================  ==================  ==================
small GET, p50 (a fresh connection each)   0.6 ms              1.7-1.9 ms
64 MiB download                            0.32-0.42 GB/s      0.05-0.13 GB/s
per box: set up and tear down              --                  0.3 ms (a gate)
=========================================  ==================  ==================

The other way, rules in a network namespace of each box's own (``ip netns add``, a veth pair,
addresses, 4 iptables rules, ``ip netns del``), took 138-170 ms per box (~500x a gate), needs
root on the node (the proxy does not: rootless bwrap nodes keep it), cannot admit hosts by name
(a CDN's addresses change under an address rule), and bubblewrap 0.8 cannot enter a namespace
made for it (``--unshare-net`` only). The proxy admits by name and address and refuses with a
403 that names the rule. Its costs: a few ms per request; as root none per ``run`` (the gate
listens in the box's own namespace, :mod:`vfray.runtimes._box_netns`), rootless each ``run``
starts through the bridge's forwarder (+57-70 ms per run at that load before it was trimmed to
C modules and ``posix_spawn``, about half since, as for the interception's bridge). Its
limit: only HTTP(S) and what speaks ``CONNECT`` go out; raw TCP (ssh, a database driver) does
not, and programs that ignore the proxy variables fail closed (the box has no route of its own).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import shutil
import socket
import time
from pathlib import Path
from urllib.parse import urlsplit

from vfray.errors import SandboxError
from vfray.runtimes._executor import blocking
from vfray.runtimes.bridge import BridgeSet, UnixBridge, _pipe
from vfray.runtimes.network_policy import (
    Address,
    BoxNetwork,
    EgressPolicy,
    as_address,
    unresolved,
)

logger = logging.getLogger(__name__)

EGRESS_PORT = 3128
"""The port of the proxy on a box's own loopback (below the ephemeral range, where an
interception listener never lands)."""
APT_CONF = "apt.conf"
"""The apt configuration the box's ``APT_CONFIG`` names, in its bridge dir."""
APT_LISTS = "/var/lib/apt/vfray-lists/"
APT_ARCHIVES = "/var/cache/apt/vfray-archives/"
"""Where apt in a box keeps its package lists and downloads (root's, not ``_apt``'s)."""
NODE_CA = "node-extra-ca.pem"
"""The node's ``NODE_EXTRA_CA_CERTS`` roots, copied into a box's bridge dir."""
HEAD_TIMEOUT = 30.0
"""Seconds for a client to send its request head."""
CONNECT_TIMEOUT = 30.0
"""Seconds to connect to an admitted host."""
_HOP_HEADERS = frozenset({"proxy-connection", "proxy-authorization", "connection", "keep-alive"})
_NODE_TTL = 5.0


def _fib_locals(text: str) -> set[Address]:
    """The node's IPv4 addresses from ``/proc/net/fib_trie`` (``/32 host LOCAL`` leaves)."""
    found: set[Address] = set()
    last = ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("|--"):
            last = stripped[3:].strip()
        elif "/32 host LOCAL" in stripped and last:
            with contextlib.suppress(ValueError):
                found.add(ipaddress.ip_address(last))
    return found


def _inet6_locals(text: str) -> set[Address]:
    found: set[Address] = set()
    for line in text.splitlines():
        if line.split():
            raw = line.split()[0]
            with contextlib.suppress(ValueError):
                found.add(ipaddress.IPv6Address(int(raw, 16)))
    return found


class EgressProxy:
    """This process's gates, and the node's own addresses (refused unless named)."""

    def __init__(self) -> None:
        self.gates: set[EgressGate] = set()
        self._node: frozenset[Address] = frozenset()
        self._node_at = -_NODE_TTL

    def node_addresses(self) -> frozenset[Address]:
        """Addresses of this node's interfaces: a box must not reach the node's services
        (Ray's ports, other boxes' listeners) through the proxy."""
        now = time.monotonic()
        if now - self._node_at > _NODE_TTL:
            found: set[Address] = set()
            for path, parse in (
                ("/proc/net/fib_trie", _fib_locals),
                ("/proc/net/if_inet6", _inet6_locals),
            ):
                with contextlib.suppress(OSError):
                    found |= parse(Path(path).read_text())
            self._node, self._node_at = frozenset(found), now
        return self._node


_PROXY = EgressProxy()


def node_proxy() -> EgressProxy:
    """The proxy of this process (one per node owner)."""
    return _PROXY


def _answer(status: str, why: str) -> bytes:
    body = f"vfray egress proxy: {why}\n".encode()
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode() + body


def _authority(target: str, default: int) -> tuple[str, int]:
    host, _, port = target.rpartition(":")
    if not host or "]" in port:  # no port, or a bare [v6]
        host, port = target, str(default)
    if not port.isdigit():
        raise ValueError(target)
    return host.strip("[]"), int(port)


class EgressGate(UnixBridge):
    """One box's way out: a unix socket served as an HTTP proxy under the box's current
    policy."""

    def __init__(self, bridges: BridgeSet, network: BoxNetwork, proxy: EgressProxy) -> None:
        super().__init__(bridges.directory / f"{EGRESS_PORT}.sock", "egress proxy", EGRESS_PORT)
        self.network = network
        self.proxy = proxy
        self.bridges = bridges
        self.box_dir = bridges.box_dir
        self.policy = network.setup or EgressPolicy("setup", ())
        self.refused: list[str] = []
        """Why requests were refused (the last 100), for the box's owner to report."""
        self.node_ca = False
        """Whether the box has the node's extra Node.js roots (:data:`NODE_CA`)."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{EGRESS_PORT}"

    def env(self) -> dict[str, str]:
        """The variables that send a box's programs through the gate, but not to the hosts
        they reach on their own (the bridged interception and tool servers)."""
        url = self.url
        direct = [b.host for b in self.bridges.bridges.values() if b is not self]
        keep = ",".join(dict.fromkeys(["localhost", "127.0.0.1", "::1", *direct]))
        return {
            "HTTP_PROXY": url,
            "HTTPS_PROXY": url,
            "http_proxy": url,
            "https_proxy": url,
            "NO_PROXY": keep,
            "no_proxy": keep,
            "npm_config_proxy": url,
            "npm_config_https_proxy": url,
            "APT_CONFIG": f"{self.box_dir}/{APT_CONF}",
            **({"NODE_EXTRA_CA_CERTS": f"{self.box_dir}/{NODE_CA}"} if self.node_ca else {}),
        }

    async def open(self, bridges: BridgeSet) -> None:
        """Serve the box of ``bridges`` from its setup phase on: its files written into their
        dir, attached to them (closed with them). Again for each rollout of a warm box, which
        keeps its gate (and its listener in the box's namespace, ~0.4 ms of the owner's CPU
        to make anew): the policy back to setup's, no refusal or connection of the rollout
        before kept. The policy itself is the same: a warm box is only taken for its spec."""
        self.cut()
        self.policy = self.network.setup or EgressPolicy("setup", ())
        self.refused = []
        self.bridges = bridges
        self.box_dir = bridges.box_dir
        bridges.directory.mkdir(parents=True, exist_ok=True)
        (bridges.directory / APT_CONF).write_text(
            f'Acquire::http::Proxy "{self.url}";\nAcquire::https::Proxy "{self.url}";\n'
            # A container's root has no CAP_SETUID: apt cannot drop to its _apt user.
            'APT::Sandbox::User "root";\n'
            # Nor CAP_DAC_OVERRIDE: the image's lists/partial and archives/partial are _apt's
            # 0700 dirs, which it cannot enter ("Problem unlinking ... Permission denied",
            # then no Release file). Dirs of root's own instead (apt makes them under its
            # state and cache dirs); an image's kept lists are not read, so setup runs
            # `apt-get update` first.
            f'Dir::State::Lists "{APT_LISTS}";\nDir::Cache::Archives "{APT_ARCHIVES}";\n'
        )
        extra = os.environ.get("NODE_EXTRA_CA_CERTS")
        self.node_ca = bool(extra and os.path.isfile(extra))
        if extra and self.node_ca:
            # A node behind a TLS-inspecting proxy trusts its CA this way; a box going out
            # through the gate meets the same proxy (npm failed SELF_SIGNED_CERT_IN_CHAIN here
            # without it). Node's variable adds roots; the image's own trust store is left
            # alone. A copy, never a link: the box may write in its bridge dir.
            shutil.copyfile(extra, bridges.directory / NODE_CA)
        await bridges.attach(EGRESS_PORT, self)
        self.proxy.gates.add(self)

    def cut(self) -> None:
        """Every connection through the gate cut."""
        for task in list(self._conns):
            task.cancel()

    async def enter_agent_phase(self) -> None:
        """The agent's policy from now on; what setup opened is cut."""
        self.policy = self.network.agent or EgressPolicy("agent", ())
        self.cut()

    async def close(self) -> None:
        await super().close()
        self.proxy.gates.discard(self)

    def release(self) -> None:
        """A warm box's gate (which makes no socket) out of use until :meth:`open` again: its
        connections cut, out of the node's proxy."""
        self.cut()
        self.proxy.gates.discard(self)

    def _refuse(self, why: str) -> bytes:
        self.refused = [*self.refused[-99:], why]
        logger.debug("egress refused: %s", why)
        return _answer("403 Forbidden", why)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        try:
            await self._serve(reader, writer)
        except (ConnectionError, OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()
            self._conns.discard(task)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT)
        except TimeoutError:
            return
        lines = head.decode("latin-1").split("\r\n")
        try:
            method, target, version = lines[0].split(" ", 2)
            if method == "CONNECT":
                host, port = _authority(target, 443)
                path = ""
            else:
                parts = urlsplit(target)
                if parts.scheme != "http" or not parts.hostname:
                    raise ValueError(target)
                host, port = parts.hostname, parts.port or 80
                path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        except ValueError:
            writer.write(_answer("400 Bad Request", "send CONNECT host:port or an http:// URL"))
            return
        policy = self.policy
        why = policy.refuses_name(host, port)
        if why is not None:
            writer.write(self._refuse(why))
            return
        address, why = await self._admitted(policy, host, port)
        if address is None:
            unknown = why.endswith("does not resolve")
            writer.write(_answer("502 Bad Gateway", why) if unknown else self._refuse(why))
            return
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(str(address), port), CONNECT_TIMEOUT
            )
        except (OSError, TimeoutError) as exc:
            writer.write(_answer("502 Bad Gateway", f"cannot connect to {host}:{port}: {exc}"))
            return
        try:
            if method == "CONNECT":
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
                return
            kept = [
                line
                for line in lines[1:]
                if line and line.split(":", 1)[0].strip().lower() not in _HOP_HEADERS
            ]
            # One request per connection: the next one may name another host.
            up_writer.write(
                "\r\n".join(
                    [f"{method} {path} {version}", *kept, "Connection: close", "", ""]
                ).encode("latin-1")
            )
            sending = asyncio.ensure_future(_pipe(reader, up_writer))
            try:
                await _pipe(up_reader, writer)
            finally:
                sending.cancel()
        finally:
            with contextlib.suppress(Exception):
                up_writer.close()

    async def _admitted(
        self, policy: EgressPolicy, host: str, port: int
    ) -> tuple[Address | None, str]:
        """The first address of ``host`` the policy admits, or None and why not."""
        literal = as_address(host)
        if literal is not None:
            addresses: list[Address] = [literal]
        else:
            try:
                infos = await asyncio.get_running_loop().getaddrinfo(
                    host, port, type=socket.SOCK_STREAM
                )
            except (OSError, UnicodeError):
                return None, f"{host} does not resolve"
            addresses = []
            for info in infos:
                found = as_address(str(info[4][0]))
                if found is not None and found not in addresses:
                    addresses.append(found)
        node = self.proxy.node_addresses()
        first_why = f"{host} has no address"
        for address in addresses:
            why = policy.refuses(host, address, port, node)
            if why is None:
                return address, ""
            first_why = why if first_why.endswith("no address") else first_why
        return None, first_why


async def check_named_hosts(network: BoxNetwork, where: str) -> None:
    """A :class:`SandboxError` naming the agent phase's hosts that do not resolve here
    (``where``: the box)."""
    # No thread hop for a box that names no host (most): nothing to resolve.
    missing = await blocking(unresolved, network.named_hosts) if network.named_hosts else []
    if missing:
        raise SandboxError(f"{where}: network_allow host(s) {', '.join(missing)} do not resolve")


async def open_gate(network: BoxNetwork, bridges: BridgeSet) -> EgressGate | None:
    """The box's gate on this node's proxy, attached to its ``bridges`` (and so closed with
    them), or None when the box has no proxied network. Its named hosts are checked first, by
    the box (:func:`check_named_hosts`), before anything of it is made."""
    if not network.proxied:
        return None
    gate = EgressGate(bridges, network, node_proxy())
    await gate.open(bridges)
    return gate
