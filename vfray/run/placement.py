"""Where a rollout may run, from its task's resources: which hosts' nodes can fit it, whether any
node ever can (a task no node fits is refused before the run), and how many of each node's GPUs
and custom resources the rollouts placed there hold, so a node never runs more GPU tasks at once
than it has GPUs.

A node is described the way Ray does (``ray.nodes()``' ``Resources``): ``CPU``, ``memory`` in
bytes, ``GPU``, and custom resources such as ``{"A100": 2}`` or the ``accelerator_type:A100``
Ray adds for the GPUs it detects. The driver routes per rollout, among long-lived hosts, rather
than Ray per call: a SandboxHost runs many rollouts in one process and reserves no Ray
resources (a reservation per host would starve the episode tasks, and one per rollout call
would cost an actor call's placement for every box), so the hosts are started on every node and
labelled with their node's resources, and the accounting lives here, Ray-free and tested
without a cluster. CPUs and memory are a box's limits, not reserved: a node runs as many boxes
as the run's concurrency sends it; only countable devices (GPUs, custom resources) are held.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping, Sequence

from vfray.task import TaskResources

GIB = 1024**3
"""``TaskResources.memory`` is in GB of 1024**3 bytes, as the boxes' memory limits are."""

UNCOUNTED = frozenset({"CPU", "memory", "object_store_memory"})
"""Node resources a box is limited by but a rollout does not hold."""


def demand(res: TaskResources) -> dict[str, float]:
    """What one rollout of a task needs of its node, in Ray's names (GPU type included as the
    custom resource of that name)."""
    need: dict[str, float] = {"CPU": res.cpu}
    if res.memory is not None:
        need["memory"] = res.memory * GIB
    if res.gpu_count:
        need["GPU"] = res.gpu_count
    return need


def _typed_gpus(node: Mapping[str, float], kind: str) -> float:
    """How many GPUs of type ``kind`` a node has: the custom resource of that name, else all its
    GPUs when Ray detected them as that type (``accelerator_type:KIND``)."""
    if kind in node:
        return node[kind]
    if node.get(f"accelerator_type:{kind}", 0) > 0:
        return node.get("GPU", 0.0)
    return 0.0


def held(res: TaskResources) -> dict[str, float]:
    """What a rollout holds of its node while it runs: its GPUs (and their type's resource)."""
    if not res.gpu_count:
        return {}
    hold = {"GPU": res.gpu_count}
    if res.gpu_type:
        hold[f"gpu:{res.gpu_type}"] = res.gpu_count
    return hold


def capacity(node: Mapping[str, float], res: TaskResources) -> dict[str, float]:
    """The node's totals of what :func:`held` names for this task."""
    cap = {"GPU": node.get("GPU", 0.0)}
    if res.gpu_type:
        cap[f"gpu:{res.gpu_type}"] = _typed_gpus(node, res.gpu_type)
    return cap


def fits(node: Mapping[str, float], res: TaskResources) -> bool:
    """Whether the node could ever run one rollout of the task (nothing else running)."""
    need = demand(res)
    if need["CPU"] > node.get("CPU", 0.0) or need.get("memory", 0.0) > node.get("memory", 0.0):
        return False
    cap = capacity(node, res)
    return all(amount <= cap.get(name, 0.0) for name, amount in held(res).items())


def unfit(res: TaskResources, nodes: Sequence[Mapping[str, float]], where: str) -> str | None:
    """Why no node of ``nodes`` could ever fit the task, one line (None when one can);
    ``where`` names them ("the largest node", "this machine")."""
    if any(fits(node, res) for node in nodes):
        return None
    cpus = max((n.get("CPU", 0.0) for n in nodes), default=0.0)
    if res.cpu > cpus:
        return f"needs {res.cpu:g} CPUs; {where} has {cpus:g}"
    mem = max((n.get("memory", 0.0) for n in nodes), default=0.0)
    if res.memory is not None and res.memory * GIB > mem:
        return f"needs {res.memory:g} GB of memory; {where} has {mem / GIB:.1f}"
    if res.gpu_type:
        most = max((_typed_gpus(n, res.gpu_type) for n in nodes), default=0.0)
        return f"needs GPU {res.gpu!r}; {where} has {most:g} {res.gpu_type!r} GPUs"
    gpus = max((n.get("GPU", 0.0) for n in nodes), default=0.0)
    if res.gpu_count > gpus:
        return f"needs {res.gpu_count:g} GPUs; {where} has {gpus:g}"
    return f"needs {res.cpu:g} CPUs, {res.memory or 0:g} GB and {res.gpu or 'no'} GPU on one node"


def this_machine() -> dict[str, float]:
    """The local backend's one node: its CPUs, physical memory and NVIDIA GPUs (device files)."""
    memory = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    try:
        gpus = sum(1 for name in os.listdir("/dev") if name[6:].isdigit() and name[:6] == "nvidia")
    except OSError:
        gpus = 0
    return {"CPU": float(os.cpu_count() or 1), "memory": memory, "GPU": float(gpus)}


class Placement:
    """The hosts of a backend and their nodes' resources: which hosts a task may run on, and
    what the rollouts placed on each node hold. ``nodes[i]`` is host ``i``'s node (its id and
    Ray resources); several hosts may share a node, and then share its GPUs."""

    def __init__(self, nodes: Sequence[tuple[str, Mapping[str, float]]], where: str) -> None:
        self.node_ids = [node_id for node_id, _ in nodes]
        self.resources = {node_id: dict(res) for node_id, res in nodes}
        self.where = where
        self.in_use: dict[str, dict[str, float]] = {node_id: {} for node_id in self.resources}
        self._freed = asyncio.Condition()

    def unfit(self, res: TaskResources) -> str | None:
        return unfit(res, list(self.resources.values()), self.where)

    def hosts_for(self, res: TaskResources) -> list[int]:
        """The hosts whose node could ever fit the task."""
        return [i for i, n in enumerate(self.node_ids) if fits(self.resources[n], res)]

    def _free(self, node_id: str, res: TaskResources) -> bool:
        cap, use = capacity(self.resources[node_id], res), self.in_use[node_id]
        return all(use.get(k, 0.0) + v <= cap.get(k, 0.0) for k, v in held(res).items())

    async def acquire(self, res: TaskResources, pick: Callable[[list[int]], int]) -> int:
        """A host for one rollout: ``pick`` chooses among the hosts whose node fits the task and
        has its GPUs free now (waiting until a rollout there releases them); they are held until
        :meth:`release`. A task holding nothing may go to any host that fits it."""
        hosts = self.hosts_for(res)
        async with self._freed:
            while True:
                free = [i for i in hosts if self._free(self.node_ids[i], res)]
                if free:
                    host = pick(free)
                    use = self.in_use[self.node_ids[host]]
                    for k, v in held(res).items():
                        use[k] = use.get(k, 0.0) + v
                    return host
                await self._freed.wait()

    async def release(self, host: int, res: TaskResources) -> None:
        if not held(res):
            return
        async with self._freed:
            use = self.in_use[self.node_ids[host]]
            for k, v in held(res).items():
                use[k] = use.get(k, 0.0) - v
            self._freed.notify_all()
