"""The built-in models as Ray actors, so ``model="scripted:<policy>"`` and ``model="local:<name>"``
work on a cluster: each actor serves an OpenAI-compatible endpoint on its node's address (the
SandboxHosts of every node call it), which for a local run is 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import ray

from vfray.endpoints.serving import close_abandoning, serve_in_loop
from vfray.models.local import LocalModelServer
from vfray.owned_process import tune_owned_process


class ScriptedModelServer:
    """Serves :class:`vfray.models.scripted.server.ScriptedModel`; ``url()`` gives the base URL."""

    def __init__(self, policy: str, options: dict[str, Any], bind_host: str | None = None) -> None:
        from vfray.models.scripted.server import ScriptedModel

        tune_owned_process()

        self.app = ScriptedModel(policy=policy, **options)
        self.bind_host = bind_host or ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        self._stack = contextlib.AsyncExitStack()
        self._url: str | None = None

    async def url(self) -> str:
        if self._url is None:
            base = await self._stack.enter_async_context(
                serve_in_loop(self.app, host=self.bind_host)
            )
            self._url = base + "/v1"
        return self._url

    async def shutdown(self) -> None:
        # The farm shuts its hosts down first: a request still here is a cancelled rollout's.
        await close_abandoning(self._stack)
        self._url = None


class LocalModelActor:
    """Runs a ``local:<name>`` model server subprocess on this actor's node; ``url()`` starts
    it on first use and gives the base URL. The server dies with the actor (parent-death
    signal), so ``ray.kill`` leaves nothing behind; ``shutdown()`` stops it gracefully."""

    def __init__(self, model: str, bind_host: str | None = None) -> None:
        tune_owned_process()
        host = bind_host or ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        self.server = LocalModelServer(model, host=host)
        self._lock = asyncio.Lock()
        self._url: str | None = None

    async def url(self) -> str:
        async with self._lock:
            if self._url is None:
                self._url = await self.server.astart()
            return self._url

    async def pid(self) -> int | None:
        return self.server.pid

    async def shutdown(self) -> None:
        async with self._lock:
            await asyncio.to_thread(self.server.stop)
            self._url = None
