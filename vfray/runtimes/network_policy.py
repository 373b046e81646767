"""A box's network policy as records: the host rules of ``network_allow`` / ``network_block``,
which hosts each phase of a rollout may reach (:class:`BoxNetwork`), and the check that a named
host resolves.

The rule (bwrap and docker; the runtime's ``share_network`` option is the runtime's policy):

- ``share_network=False``: no network in any phase.
- Otherwise the setup phase (``task.setup``, ``harness.setup``) reaches any host through the
  node's egress proxy (:mod:`vfray.runtimes.egress`) but the blocked ones and the node's own,
  loopback and link-local addresses; the agent phase (and finalize, scoring) reaches only the
  task's ``network_allow`` hosts. ``"*"`` in ``network_allow`` (the default) leaves the agent
  phase to the runtime: nothing (the default), or any host when ``share_network=True``.
- ``network_block`` is refused in every phase, even under ``"*"``; ``"*"`` in it means no
  network at all. ``share_network=True`` with nothing blocked and no hosts named keeps the
  node's network unfiltered (raw sockets included), as before.

A host rule is a name (``pypi.org``), a wildcard (``*.pythonhosted.org``: its subdomains), an
address or a CIDR (``10.0.0.0/8``), each with an optional ``:port``.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from vfray.errors import ConfigError

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
_NAME = re.compile(r"(\*\.)?[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?)*")


def as_address(host: str) -> Address | None:
    """``host`` as an IP address (brackets and a zone dropped), or None for a name."""
    try:
        address = ipaddress.ip_address(host.strip("[]").split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


@dataclass(frozen=True)
class HostRule:
    """One entry of ``network_allow`` or ``network_block``."""

    entry: str
    name: str | None = None
    """A lower-case name, or ``*.suffix`` for the suffix's subdomains."""
    network: Network | None = None
    port: int | None = None

    @classmethod
    def parse(cls, entry: str, field: str = "network_allow") -> HostRule:
        """Raises :class:`ConfigError` (one line) for an entry that names no host."""
        text = entry.strip().lower()
        bad = ConfigError(
            f"{field} entry {entry!r} is not a host: use a name (pypi.org), a wildcard "
            "(*.example.com), an address or a CIDR (10.0.0.0/8), with an optional :port"
        )
        if not text or "://" in text or " " in text:
            raise bad
        host, port = text, None
        if text.startswith("["):  # [v6] or [v6]:port
            host, _, rest = text[1:].partition("]")
            if rest:
                if not rest.startswith(":") or not rest[1:].isdigit():
                    raise bad
                port = int(rest[1:])
        elif text.count(":") == 1:
            host, _, digits = text.partition(":")
            if not digits.isdigit():
                raise bad
            port = int(digits)
        if port is not None and not 0 < port < 65536:
            raise bad
        try:
            network = ipaddress.ip_network(host, strict=False) if "/" in host else None
        except ValueError:
            raise bad from None
        if network is not None:
            return cls(entry, network=network, port=port)
        address = as_address(host)
        if address is not None:
            return cls(entry, network=ipaddress.ip_network(address), port=port)
        if _NAME.fullmatch(host) is None:
            raise bad
        return cls(entry, name=host, port=port)

    def _port_ok(self, port: int) -> bool:
        return self.port is None or self.port == port

    def matches_name(self, host: str, port: int) -> bool:
        if self.name is None or not self._port_ok(port):
            return False
        host = host.lower().rstrip(".")
        if self.name.startswith("*."):
            return host.endswith(self.name[1:])
        return host == self.name

    def matches_address(self, address: Address, port: int) -> bool:
        return self.network is not None and self._port_ok(port) and address in self.network

    @property
    def resolvable(self) -> bool:
        """A plain name (not a wildcard, not an address): one that must resolve."""
        return self.name is not None and not self.name.startswith("*.")


def parse_rules(entries: Iterable[str], field: str) -> tuple[HostRule, ...]:
    return tuple(HostRule.parse(e, field) for e in entries if e != "*")


@dataclass(frozen=True)
class EgressPolicy:
    """What one phase of a box may reach through the egress proxy."""

    phase: str
    allow: tuple[HostRule, ...] | None
    """None: any host but the node's own, loopback and link-local addresses (named ones
    excepted); a tuple: these hosts only (empty: none)."""
    block: tuple[HostRule, ...] = ()

    def refuses_name(self, host: str, port: int) -> str | None:
        """Why ``host`` is refused before it is resolved, or None to resolve it."""
        if any(rule.matches_name(host, port) for rule in self.block):
            return f"{host} is in network_block"
        if self.allow is not None and as_address(host) is None:
            by_name = any(rule.matches_name(host, port) for rule in self.allow)
            if not by_name and not any(rule.network is not None for rule in self.allow):
                # No address rule could admit it: refused without asking any resolver.
                return self._not_allowed(host, port)
        return None

    def _not_allowed(self, host: str, port: int) -> str:
        where = ", ".join(rule.entry for rule in self.allow or ()) or "no host"
        return f"{host}:{port} is not in network_allow ({where}) in the {self.phase} phase"

    def refuses(
        self, host: str, address: Address, port: int, node: frozenset[Address]
    ) -> str | None:
        """Why a connection to ``host`` at ``address`` is refused, or None."""
        if any(rule.matches_address(address, port) for rule in self.block):
            return f"{host} ({address}) is in network_block"
        if self.allow is None:
            named = False
        else:
            named = any(
                rule.matches_name(host, port) or rule.matches_address(address, port)
                for rule in self.allow
            )
            if not named:
                return self._not_allowed(host, port)
        if not named and (
            address in node
            or address.is_loopback
            or address.is_link_local
            or address.is_multicast
            or address.is_unspecified
        ):
            return (
                f"{host} ({address}) is the node's own or a link-local address "
                "(name it in network_allow)"
            )
        return None


@dataclass(frozen=True)
class BoxNetwork:
    """The network of one box, per phase."""

    host_network: bool
    """The box shares the node's network, unfiltered (no proxy)."""
    setup: EgressPolicy | None
    agent: EgressPolicy | None

    @property
    def proxied(self) -> bool:
        return not self.host_network and (self.setup is not None or self.agent is not None)

    @property
    def named_hosts(self) -> tuple[str, ...]:
        """The plain names the agent phase allows: each must resolve."""
        if self.agent is None or self.agent.allow is None:
            return ()
        return tuple(rule.name for rule in self.agent.allow if rule.resolvable and rule.name)


def box_network(
    allow: Sequence[str], block: Sequence[str], share_network: bool | None
) -> BoxNetwork:
    """The rule of the module docstring. Raises :class:`ConfigError` for a bad entry."""
    allow_rules = parse_rules(allow, "network_allow")
    block_rules = parse_rules(block, "network_block")
    if share_network is False or "*" in block:
        return BoxNetwork(host_network=False, setup=None, agent=None)
    any_host = share_network is True and "*" in allow
    if any_host and not block_rules and not allow_rules:
        return BoxNetwork(host_network=True, setup=None, agent=None)
    setup = EgressPolicy("setup", None, block_rules)
    if any_host:
        agent = EgressPolicy("agent", None, block_rules)
    else:
        agent = EgressPolicy("agent", allow_rules, block_rules)
    return BoxNetwork(host_network=False, setup=setup, agent=agent)


def unresolved(names: Iterable[str]) -> list[str]:
    """The names among ``names`` this machine cannot resolve."""
    return [name for name in dict.fromkeys(names) if not _resolves(name)]


def _resolves(name: str) -> bool:
    try:
        return bool(socket.getaddrinfo(name, None, type=socket.SOCK_STREAM))
    except (OSError, UnicodeError):
        return False


_RESOLVED: set[str] = set()
"""Names :func:`check_task_network` found resolving: a run's tasks ask for the same few."""


def check_task_network(allow: Sequence[str], block: Sequence[str], where: str) -> None:
    """On the driver, before a task's rollouts: its entries must be hosts, and the names it
    allows must resolve (each name looked up once per process while it keeps resolving)."""
    parse_rules(block, "network_block")
    names = [r.name for r in parse_rules(allow, "network_allow") if r.resolvable and r.name]
    fresh = [name for name in names if name not in _RESOLVED]
    if fresh:
        check_resolvable(fresh, where)
        _RESOLVED.update(fresh)


def check_resolvable(allow: Sequence[str], where: str) -> None:
    """Refuse, in one line, ``network_allow`` names that do not resolve here."""
    names = [r.name for r in parse_rules(allow, "network_allow") if r.resolvable and r.name]
    missing = unresolved(names)
    if missing:
        raise ConfigError(
            f"{where}: network_allow host{'s' if len(missing) > 1 else ''} "
            f"{', '.join(missing)} do{'' if len(missing) > 1 else 'es'} not resolve"
        )
