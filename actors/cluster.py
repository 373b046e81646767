"""Connecting to Ray and placing vfray's actors: a local Ray kept on loopback when none is
running, an existing cluster when an address (or ``ray job submit``) says so."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from actors import _local_ray
from actors._probe import check_address
from actors.interception_pool import PoolRef
from actors.model_server import LocalModelActor, ScriptedModelServer
from actors.sandbox_host import LateUrl, SandboxHost
from vfray import errors
from vfray.interception import InterceptionSettings
from vfray.rollout import RolloutPlan
from vfray.run.placement import Placement
from vfray.run.sink import TraceSink
from vfray.runtimes.tunnels import TunnelSettings

log = logging.getLogger(__name__)


def connect(address: str | None = None, *, num_cpus: int | None = None) -> bool:
    """Make sure Ray is initialised; returns True when this call started a local Ray.

    With no ``address`` and no ``RAY_ADDRESS`` (which ``ray job submit`` sets) a local Ray is
    started that listens on 127.0.0.1 only, with Ray's token auth on and a token of its own
    (:mod:`actors._local_ray`). Joining an existing cluster changes nothing of its settings:
    its RAY_AUTH_MODE and token (environment or ``~/.ray/auth_token``) apply as they are.
    """
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        _local_ray.restore_auth_settings()
        check_address(address)  # seconds, where ray.init waits minutes
        ray.init(address=address, log_to_driver=False)
        return False
    _local_ray.start(num_cpus)
    log.info("started a local Ray on %s", _local_ray.LOOPBACK)
    return True


def alive_nodes() -> list[dict[str, Any]]:
    return [n for n in ray.nodes() if n.get("Alive")]  # type: ignore[no-untyped-call]


def local_node_strategy() -> NodeAffinitySchedulingStrategy:
    return NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)


def start_scripted_model(policy: str, options: dict[str, Any], name: str) -> Any:
    """The scripted model server, on the driver's node, as the actor ``name`` (the hosts find
    it by name: :class:`~actors.sandbox_host.LateUrl`)."""
    actor_cls = ray.remote(ScriptedModelServer)
    return actor_cls.options(
        name=name, num_cpus=0, max_concurrency=10_000, scheduling_strategy=local_node_strategy()
    ).remote(policy, options)


def start_local_model(model: str, name: str) -> Any:
    """The ``local:<name>`` model server, on the driver's node like the scripted one. It
    reserves no Ray CPUs so it can never starve the episode tasks on a small machine."""
    actor_cls = ray.remote(LocalModelActor)
    return actor_cls.options(
        name=name, num_cpus=0, max_concurrency=100, scheduling_strategy=local_node_strategy()
    ).remote(model)


def hosts_per_node(
    cpus: dict[str, float],
    *,
    total: int | None = None,
    per_node: int | None = None,
    cpus_per_host: float = 4.0,
) -> list[str]:
    """The node of each SandboxHost to start, from each node's CPUs: ``per_node`` hosts on
    every node, else one per ``cpus_per_host`` CPUs (at least one); ``total`` instead deals
    that many round-robin. One host is one event loop, so a big node needs several (16 cores:
    1 host 50.8 rollouts/s, 4 hosts 115.7)."""
    nodes = sorted(cpus)
    if total is not None:
        return [nodes[i % len(nodes)] for i in range(total)] if nodes else []
    counts = {
        node: per_node if per_node is not None else max(1, round(cpus[node] / cpus_per_host))
        for node in nodes
    }
    # Interleaved, so the first hosts (which the driver fills first) are on different nodes.
    most = max(counts.values(), default=0)
    return [node for k in range(most) for node in nodes if counts[node] > k]


def host_placement(total: int | None, per_node: int | None, cpus_per_host: float) -> list[str]:
    """:func:`hosts_per_node` over the alive nodes."""
    cpus = {n["NodeID"]: float(n["Resources"].get("CPU", 1.0)) for n in alive_nodes()}
    return hosts_per_node(cpus, total=total, per_node=per_node, cpus_per_host=cpus_per_host) or [""]


PLACEMENT_ROUNDS = 5
"""How often misplaced hosts are started again before the farm goes on with them as they are."""

PLACEMENT_MEMORY_BYTES = 1
"""The Ray ``memory`` a SandboxHost asks for: nothing, in effect, but not an empty request.
Ray 2.60's scheduler places an actor whose resource request is empty on a random node unless
its node affinity is hard, so a ``num_cpus=0`` host with soft affinity ignored its node
(measured on a 3-node ``cluster_utils`` cluster: 3-8 of 9 such actors off their node in each
of three rounds; with one byte of memory asked, 0 of 9 in each of three rounds)."""


@dataclass(frozen=True)
class HostLayout:
    """Everything the SandboxHosts of a farm are created with: one per entry of ``placement``,
    on that node ("" places it anywhere)."""

    placement: list[str]
    plan: RolloutPlan
    base_url: str | LateUrl
    api_key_var: str | None
    harness_options: dict[str, Any]
    runtime_options: dict[str, Any]
    max_concurrency: int
    max_restarts: int = -1
    interception: PoolRef | None = None
    tunnel: TunnelSettings | None = None
    tools_prefix: str | None = None
    interception_settings: InterceptionSettings | None = None

    def start(self, index: int) -> Any:
        """Create host ``index`` on its node with soft affinity, so a host whose node dies
        restarts elsewhere. Hosts reserve no Ray CPUs: sandbox processes are theirs to manage,
        and a reservation would starve the episode tasks. They ask for one byte of memory
        instead (:data:`PLACEMENT_MEMORY_BYTES`), so that Ray honours the affinity."""
        node = self.placement[index]
        # The host's index among those on its node: it spreads a node's hosts over the node's
        # interception replicas (farm.interception_replicas_per_node).
        slot = self.placement[:index].count(node)
        return (
            ray.remote(SandboxHost)
            .options(
                num_cpus=0,
                memory=PLACEMENT_MEMORY_BYTES,
                max_concurrency=self.max_concurrency,
                max_restarts=self.max_restarts,
                scheduling_strategy=(
                    NodeAffinitySchedulingStrategy(node, soft=True) if node else "SPREAD"
                ),
            )
            .remote(
                self.plan,
                base_url=self.base_url,
                api_key_var=self.api_key_var,
                harness_options=self.harness_options,
                runtime_options=self.runtime_options,
                interception=self.interception,
                tunnel=self.tunnel,
                slot=slot,
                tools_prefix=self.tools_prefix,
                interception_settings=self.interception_settings,
            )
        )

    def start_all(self) -> list[Any]:
        return [self.start(i) for i in range(len(self.placement))]

    def settle(self, hosts: list[Any]) -> list[Any]:
        """Wait for the hosts to be up, and start again those that came up on another node
        than their own (at most :data:`PLACEMENT_ROUNDS` times).

        Hosts ask for soft node affinity, so that Ray restarts a host whose node died on a live
        node (hard affinity would fail it for good). Ray places a soft-affinity actor on
        another node only when its own is dead or could never fit it; without the byte of memory
        each host asks for, it placed one on a random node every time (a farm had two hosts on
        one node and none on another: rollouts per node 85 / 171 / 0), and five rounds of
        starting them again left two of three hosts off their node on a loaded CI machine."""
        hosts = list(hosts)
        for round_ in range(PLACEMENT_ROUNDS + 1):
            nodes = [_node_of(h) for h in hosts]
            wrong = [
                i for i, (want, got) in enumerate(zip(self.placement, nodes, strict=True))
                if want and got != want
            ]  # fmt: skip
            if not wrong:
                return hosts
            if round_ == PLACEMENT_ROUNDS:
                log.warning("%d SandboxHost(s) run off their node after %d restarts", len(wrong),
                            PLACEMENT_ROUNDS)  # fmt: skip
                return hosts
            log.info("%d SandboxHost(s) came up off their node; starting them again", len(wrong))
            for i in wrong:
                ray.kill(hosts[i], no_restart=True)
                hosts[i] = self.start(i)
        return hosts


def _node_of(host: Any, timeout: float = 120.0) -> str:
    """The node a host runs on, asked again while Ray restarts it (its node may die during
    the farm's start: the host is then on its way to another node, not lost)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            node: str = ray.get(host.stats.remote())["node_id"]
            return node
        except ray.exceptions.ActorDiedError as exc:
            raise creation_error(exc) from None
        except ray.exceptions.ActorUnavailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def creation_error(exc: ray.exceptions.ActorDiedError) -> Exception:
    """A host that could not be built (its harness or runtime refused its options on the node)
    as the one line the local backend shows: the error its constructor raised, of the same
    vfray type. Ray's message puts the cause last, after its own sentence and the traceback,
    and the terminal showed only its first line. Any other death is left as Ray says it."""
    message = str(getattr(exc, "error_msg", "") or exc)
    if not getattr(exc, "_actor_init_failed", False):
        return exc
    last = next((ln for ln in reversed(message.splitlines()) if ln.strip()), "")
    kind, sep, cause = last.partition(": ")
    name = kind.rsplit(".", 1)[-1]
    found = getattr(errors, name, None) if kind.startswith("vfray.") else None
    if sep and isinstance(found, type) and issubclass(found, errors.VfrayError):
        return found(cause)
    return errors.ConfigError(f"a SandboxHost could not be built: {last.strip()}")


def start_sink(
    run_dir: str,
    header: dict[str, Any],
    flush_rows: int,
    flush_seconds: float,
    max_restarts: int = 5,
) -> Any:
    """The sink writes the run folder, so it lives on the driver's node. Ray restarts it
    when it dies; the backend re-sends the rows it had not yet written."""
    actor_cls = ray.remote(TraceSink)
    return actor_cls.options(
        num_cpus=0,
        max_concurrency=1,
        max_restarts=max_restarts,
        scheduling_strategy=local_node_strategy(),
    ).remote(run_dir, header, flush_rows=flush_rows, flush_seconds=flush_seconds)


def host_placement_of(hosts: list[Any]) -> Placement:
    """Each host's node and that node's Ray resources (CPUs, memory, GPUs, custom resources
    such as ``{"A100": 2}``): the driver routes a task's rollouts to hosts whose node fits it,
    holds its GPUs there while it runs, and refuses a task no host's node can ever fit."""
    resources = {n["NodeID"]: dict(n["Resources"]) for n in alive_nodes()}
    nodes = [(node, resources.get(node, {})) for node in (_node_of(h) for h in hosts)]
    return Placement(nodes, "the largest node")
