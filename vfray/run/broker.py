"""The :class:`~vfray.rollout.SessionBroker` for an interception app in this process: how a
rollout registers, snapshots and concludes its session when the interception runs beside it (the
local backend, a SandboxHost's own app, a seat's own endpoint)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from vfray.interception import InterceptionApp, Limits
from vfray.trace import Trace

__all__ = ["InProcessBroker"]


class InProcessBroker:
    """The :class:`~vfray.rollout.SessionBroker` for an interception app in this process."""

    def __init__(self, app: InterceptionApp) -> None:
        self.app = app

    async def register(
        self,
        trace: Trace,
        limits: Limits,
        stop_check: Callable[[Trace], Awaitable[str | None]] | None,
        sampling: Mapping[str, Any] | None,
    ) -> str:
        return self.app.register(
            trace,
            limits=limits,
            stop_check=stop_check,
            sampling=dict(sampling) if sampling else None,
        )

    async def conclude(self, secret: str) -> Trace:
        return self.app.conclude(secret)

    async def snapshot(self, secret: str) -> Trace:
        return self.app.snapshot(secret)

    def endpoint(self, secret: str) -> str | None:
        return None  # the rollout's own interception_url
