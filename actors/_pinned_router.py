"""The Serve request router of the interception pool (:mod:`actors.interception_pool`), apart from
it: ``ray.serve`` costs ~1.2 s to import here (pandas with it), which a SandboxHost and the driver
of a farm with ``farm.interception = "host"`` (the default) never need."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from ray.serve.request_router import LocalityMixin, PendingRequest, RequestRouter, RunningReplica

SPREAD_WAIT_S = 20.0
"""How long a broker's first call waits for all of its node's replicas to be up, so that the
node's hosts spread over them, before it pins itself to one of those already up."""


class PinnedRouter(LocalityMixin, RequestRouter):
    """Serve's request router for the pool (it runs in the caller, a SandboxHost). A call with
    ``replica=<unique id>`` goes to that replica while it is up; one with ``slot=k`` (a broker's
    first) to the ``k``-th of the caller's node's replicas in a fixed order; otherwise, or when
    the named replica is gone, to a replica on the caller's node first — which answers "lost"
    for a session it never held. No FIFOMixin: Serve's default then hands each chosen replica
    to exactly the request it was chosen for (FIFO would give it to the queue's head)."""

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        kwargs: Mapping[str, Any] = pending_request.kwargs if pending_request else {}
        target = kwargs.get("replica")
        if target is not None:
            for replica in candidate_replicas:
                if replica.replica_id.unique_id == target:
                    return [[replica]]
        ranked: list[list[RunningReplica]] = self.rank_replicas_via_locality(candidate_replicas)
        slot = kwargs.get("slot")
        if slot is not None and pending_request is not None:
            local = sorted(ranked[0], key=lambda r: r.replica_id.unique_id)
            expected = int(kwargs.get("per_node") or 1)
            if len(local) < expected and time.time() - pending_request.created_at < SPREAD_WAIT_S:
                # Not all of the node's replicas are up yet: ask again after Serve's backoff.
                pending_request.routing_context.should_backoff = True
                return []
            if local:
                return [[local[int(slot) % len(local)]]]
        return [rank for rank in ranked if rank]
