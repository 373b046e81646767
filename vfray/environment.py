"""Run rollouts and episodes in this process: model, interception, harness and runtime assembled
from plain arguments. The Ray farm runs the same state machine inside its actors.

``model="scripted:<policy>"`` (optionally ``scripted:<policy>?latency=0.5&accuracy=0.8``) starts
the built-in scripted model server, ``model="local:smollm2"`` a small real model (the ``local``
extra); any other model name needs ``base_url``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping
from types import TracebackType
from typing import Any

from vfray.episode import Episode, finalize_episode
from vfray.errors import ConfigError
from vfray.harness import check_compatibility
from vfray.harnesses.registry import make_harness
from vfray.interception import Interception, InterceptionApp, Limits, Upstream
from vfray.models.local import LocalModelServer, check_installed, parse_local_model
from vfray.rollout import RolloutPlan, Timeouts, run_planned_rollout
from vfray.runtimes.registry import preflight_runtime, runtime_class
from vfray.scoring import validate_group_config
from vfray.task import Task
from vfray.trace import Trace

SCRIPTED_PREFIX = "scripted:"


def parse_scripted_model(model: str) -> tuple[str, dict[str, float]] | None:
    """``scripted:arithmetic?latency=1`` → ("arithmetic", {"latency": 1.0}); None otherwise."""
    if not model.startswith(SCRIPTED_PREFIX):
        return None
    policy, _, query = model[len(SCRIPTED_PREFIX) :].partition("?")
    options: dict[str, float] = {}
    for name, value in urllib.parse.parse_qsl(query, strict_parsing=False):
        try:
            options[name] = float(value)
        except ValueError as exc:
            raise ConfigError(f"scripted model option {name}={value!r} is not a number") from exc
    return policy, options


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

    def endpoint(self, secret: str) -> str | None:
        return None  # the rollout's own interception_url


class LocalEnvironment:
    """An async context that owns a model endpoint (scripted or real) and an interception
    server, and runs rollouts and episodes against them in this process."""

    def __init__(
        self,
        model: str = "scripted:echo",
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        api_key_var: str | None = None,
        harness: str = "bash",
        harness_options: Mapping[str, Any] | None = None,
        runtime: str = "subprocess",
        runtime_options: Mapping[str, Any] | None = None,
        sampling: Mapping[str, Any] | None = None,
        limits: Limits | None = None,
        timeouts: Timeouts | None = None,
        scoring_overrides: Mapping[str, str] | None = None,
    ) -> None:
        self.scripted = parse_scripted_model(model)
        self.local = parse_local_model(model)
        if self.scripted is None and self.local is None and base_url is None:
            raise ConfigError(
                f"model {model!r} needs base_url (or use a built-in 'scripted:<policy>' or "
                "'local:smollm2' model)"
            )
        if self.local is not None:
            # A missing extra is a config error: say the install lines before anything starts.
            check_installed(self.local.spec)
        if api_key is None and api_key_var:
            api_key = os.environ.get(api_key_var)
            if api_key is None:
                raise ConfigError(f"environment variable {api_key_var} (the API key) is not set")
        self.base_url = base_url
        self.api_key = api_key
        self.harness = make_harness(harness, dict(harness_options or {}))
        # Refuse an impossible pairing (e.g. a container-only harness on subprocess) now, not
        # as one failed rollout after another.
        check_compatibility(self.harness, runtime_class(runtime))
        preflight_runtime(self.harness, runtime, dict(runtime_options or {}))
        self.runtime_type = runtime
        self.runtime_options = dict(runtime_options or {})
        self.plan = RolloutPlan(
            model=model,
            harness_id=harness,
            runtime_type=runtime,
            sampling=dict(sampling or {}),
            limits=limits or Limits(),
            timeouts=timeouts or Timeouts(),
            scoring_overrides=dict(scoring_overrides or {}),
        )
        self._stack = contextlib.AsyncExitStack()
        self._interception: Interception | None = None

    async def __aenter__(self) -> LocalEnvironment:
        base_url = self.base_url
        if self.scripted is not None:
            from vfray.serving import serve_in_loop
            from vfray.testing.scripted import ScriptedModel

            policy, options = self.scripted
            app = ScriptedModel(policy=policy, **options)  # type: ignore[arg-type]
            base_url = await self._stack.enter_async_context(serve_in_loop(app)) + "/v1"
        elif self.local is not None:
            server = await self._stack.enter_async_context(LocalModelServer(self.local))
            base_url = server.base_url
        assert base_url is not None
        upstream = Upstream(base_url=base_url, api_key=self.api_key, model=self.plan.model)
        self._interception = await self._stack.enter_async_context(Interception(upstream))
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._stack.aclose()

    @property
    def interception(self) -> Interception:
        if self._interception is None:
            raise RuntimeError("LocalEnvironment is not started; use 'async with'")
        return self._interception

    async def rollout(
        self,
        task: Task[Any],
        *,
        rollout_index: int = 0,
        attempt: int = 0,
        run_id: str | None = None,
        episode_id: str | None = None,
    ) -> Trace:
        """Run one rollout of ``task``; failures are on the returned trace."""
        return await run_planned_rollout(
            task,
            plan=self.plan,
            harness=self.harness,
            runtime_options=self.runtime_options,
            broker=InProcessBroker(self.interception.app),
            interception_url=self.interception.url,
            rollout_index=rollout_index,
            attempt=attempt,
            run_id=run_id,
            episode_id=episode_id,
        )

    async def episode(self, task: Task[Any], n: int = 4, *, run_id: str | None = None) -> Episode:
        """Run ``n`` rollouts of ``task`` concurrently, then its group rewards."""
        validate_group_config(type(task), n)
        traces = await asyncio.gather(
            *(self.rollout(task, rollout_index=i, run_id=run_id) for i in range(n))
        )
        return await finalize_episode(task, list(traces), self.plan.scoring_overrides)


async def run_rollout(task: Task[Any], **options: Any) -> Trace:
    """One rollout of ``task`` with a fresh :class:`LocalEnvironment` built from ``options``."""
    async with LocalEnvironment(**options) as env:
        return await env.rollout(task)


async def run_episode(task: Task[Any], n: int = 4, **options: Any) -> Episode:
    """``n`` rollouts of ``task`` plus its group rewards, in this process."""
    validate_group_config(type(task), n)
    async with LocalEnvironment(**options) as env:
        return await env.episode(task, n)
