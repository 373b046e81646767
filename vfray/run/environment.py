"""Run rollouts and episodes in this process: model, interception, harness and runtime assembled
from plain arguments. The Ray farm runs the same state machine inside its actors.

``model="scripted:<policy>"`` (optionally ``scripted:<policy>?latency=0.5&accuracy=0.8``) starts
the built-in scripted model server, ``model="local:smollm2"`` a small real model (the ``local``
extra); any other model name needs ``base_url``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from types import TracebackType
from typing import Any

from pydantic import ValidationError

from vfray.config import EvalConfig, format_validation_error
from vfray.episode import Episode, finalize_episode
from vfray.errors import ConfigError
from vfray.harnesses.seats import Agent
from vfray.interception import Interception, Limits, Upstream
from vfray.models.local import LocalModelServer, parse_local_model
from vfray.rollout import Timeouts, run_planned_rollout
from vfray.run.broker import InProcessBroker
from vfray.run.seating import Station, Stations, play_game
from vfray.run.spec import RunSpec, parse_scripted_model, resolve_run
from vfray.task import Task
from vfray.trace import Trace

__all__ = [
    "LocalEnvironment",
    "parse_scripted_model",
    "run_episode",
    "run_game",
]


def _config(tree: dict[str, Any]) -> EvalConfig:
    # model_validate, not EvalConfig(...): explicit arguments, no VFRAY_* variables.
    try:
        return EvalConfig.model_validate(tree)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc)) from exc


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
        spec: RunSpec | None = None,
    ) -> None:
        if spec is None:
            # The same resolution (and checks) as a Farm's: one place decides what is valid.
            config = _config(
                {
                    "backend": "local",
                    "model": {
                        "name": model,
                        "base_url": base_url,
                        # An explicit key wins over the variable (not read then).
                        "api_key_var": api_key_var if api_key is None else None,
                    },
                    "sampling": dict(sampling or {}),
                    "env": {
                        "harness": {"id": harness, "options": dict(harness_options or {})},
                        "runtime": {"type": runtime, "options": dict(runtime_options or {})},
                        "timeouts": timeouts or Timeouts(),
                        "scoring": dict(scoring_overrides or {}),
                        **(limits or Limits()).model_dump(),
                    },
                }
            )
            spec = resolve_run(config)
            spec.preflight()
        self.spec = spec
        self.api_key = api_key if api_key is not None else spec.endpoint.api_key()
        self.harness = spec.make_harness()
        self.runtime_type = spec.plan.runtime_type
        self.runtime_options = spec.runtime_options.as_kwargs()
        self.plan = spec.plan
        self._stack = contextlib.AsyncExitStack()
        self._interception: Interception | None = None
        self._stations: Stations | None = None

    async def __aenter__(self) -> LocalEnvironment:
        endpoint = self.spec.endpoint
        base_url = endpoint.base_url
        if endpoint.kind == "scripted":
            from vfray.endpoints.serving import serve_in_loop
            from vfray.models.scripted.server import ScriptedModel

            app = ScriptedModel(
                policy=endpoint.scripted_policy,  # type: ignore[arg-type]
                **endpoint.scripted_options,  # type: ignore[arg-type]
            )
            base_url = await self._stack.enter_async_context(serve_in_loop(app)) + "/v1"
        elif endpoint.kind == "local":
            local = parse_local_model(endpoint.model)
            assert local is not None
            server = await self._stack.enter_async_context(LocalModelServer(local))
            base_url = server.base_url
        assert base_url is not None
        upstream = Upstream(base_url=base_url, api_key=self.api_key, model=self.plan.model)
        self._interception = await self._stack.enter_async_context(
            Interception(upstream, settings=self.spec.config.interception)
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # The exception goes down to the servers and the interception: on a stop they cancel
        # what is in flight instead of waiting out their graceful shutdown.
        await self._stack.__aexit__(exc_type, exc, tb)

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
            model_target=self.interception.app.upstream.target(),
        )

    def station(self) -> Station:
        """This environment's own agent: its plan, harness, box options and interception."""
        return Station(
            self.plan,
            self.harness,
            self.runtime_options,
            InProcessBroker(self.interception.app),
            self.interception.url,
        )

    async def stations(self) -> Stations:
        """Its own station and, opened on first use, one per other agent a seat names."""
        if self._stations is None:
            self._stations = Stations(self.station(), open_endpoint)
            self._stations.set_policy_version(self.interception.app.policy_version)
            self._stack.push_async_callback(self._stations.aclose)
        return self._stations

    def set_policy_version(self, version: int | None) -> None:
        """Stamp ``version`` on every model call from now on, seats' own endpoints included."""
        self.interception.app.policy_version = version
        if self._stations is not None:
            self._stations.set_policy_version(version)

    async def game(
        self,
        task: Task[Any],
        *,
        rollout_index: int = 0,
        attempt: int = 0,
        run_id: str | None = None,
        episode_id: str | None = None,
    ) -> list[Trace]:
        """Play one game of a :class:`~vfray.harnesses.seats.SeatedTask`: one trace per seat."""
        from vfray.harnesses.seats import SeatedTask

        if not isinstance(task, SeatedTask):
            raise ConfigError(f"{type(task).__name__} is not a vf.SeatedTask")
        return await play_game(
            task,
            await self.stations(),
            rollout_index=rollout_index,
            attempt=attempt,
            run_id=run_id,
            episode_id=episode_id,
        )

    async def episode(self, task: Task[Any], n: int = 4, *, run_id: str | None = None) -> Episode:
        """Run ``n`` rollouts of ``task`` concurrently (``n`` games of a seated task, one trace
        per seat each), then its group rewards."""
        from vfray.harnesses.seats import SeatedTask

        self.spec.check_task_type(type(task), n)
        if isinstance(task, SeatedTask):
            games = await asyncio.gather(
                *(self.game(task, rollout_index=i, run_id=run_id) for i in range(n))
            )
            traces = [t for game in games for t in game]
        else:
            traces = list(
                await asyncio.gather(
                    *(self.rollout(task, rollout_index=i, run_id=run_id) for i in range(n))
                )
            )
        return await finalize_episode(
            task,
            traces,
            self.plan.scoring_overrides,
            count_failed=self.spec.config.env.count_failed,
            estimator=self.spec.config.env.advantage,
        )


async def run_rollout(task: Task[Any], **options: Any) -> Trace:
    """One rollout of ``task`` with a fresh :class:`LocalEnvironment` built from ``options``."""
    async with LocalEnvironment(**options) as env:
        return await env.rollout(task)


async def run_game(task: Task[Any], **options: Any) -> list[Trace]:
    """One game of a seated task with a fresh :class:`LocalEnvironment` (the run's defaults
    for every seat whose :class:`~vfray.harnesses.seats.Agent` leaves them open)."""
    async with LocalEnvironment(**options) as env:
        return await env.game(task)


async def run_episode(task: Task[Any], n: int = 4, **options: Any) -> Episode:
    """``n`` rollouts of ``task`` plus its group rewards, in this process."""
    env = LocalEnvironment(**options)
    env.spec.check_task_type(type(task), n)  # refused before anything starts
    async with env:
        return await env.episode(task, n)


def open_endpoint(agent: Agent, model: str) -> LocalEnvironment:
    """A seat's own model endpoint and interception (its harness and runtime are never used:
    the cheapest ones are named), for :class:`~vfray.run.seating.Stations`."""
    return LocalEnvironment(
        model=model,
        base_url=agent.base_url,
        api_key_var=agent.api_key_var,
        harness="null",
        runtime="subprocess",
    )
