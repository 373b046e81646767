"""The built-in scripted model as a Ray actor, so ``model="scripted:<policy>"`` works on a
cluster: the actor serves the OpenAI-compatible app on its node's address."""

from __future__ import annotations

import contextlib
from typing import Any

import ray

from vfray.serving import serve_in_loop


class ScriptedModelServer:
    """Serves :class:`vfray.testing.scripted.ScriptedModel`; ``url()`` gives the base URL."""

    def __init__(self, policy: str, options: dict[str, Any], bind_host: str | None = None) -> None:
        from vfray.testing.scripted import ScriptedModel

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
        await self._stack.aclose()
        self._url = None
