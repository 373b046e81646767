"""The parts of v1's agent/env model a taskset package names: ``EnvConfig``/``AgentConfig``,
``Env`` (``SingleAgentEnv``, ``BestOfNEnv``), ``Episode``, ``Harness``/``Toolset`` bases.

What vfray runs of them: the single-agent env, best-of-n's sibling comparison
(``Env.finalize(task, episode)`` over the n rollouts of a task, vfray's group), and an env with
its own ``run()`` (multi-agent, user simulation) as vfray seats (:mod:`._seated`); a task's
``Toolset`` instances are vfray toolsets. A package's own ``Harness`` class is refused.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Generic

from pydantic import BaseModel, ConfigDict, Field
from typing_extensions import TypeVar

from vfray.compat.v1._data import TasksetConfig
from vfray.errors import ConfigError
from vfray.tools.toolset import Toolset as VfrayToolset
from vfray.tools.toolset import ToolSpec


class HarnessConfig(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str = "bash"


class AgentConfig(BaseModel):
    """One seat: harness x runtime x limits (only the mapped fields are honoured)."""

    model_config = ConfigDict(extra="allow")

    harness: HarnessConfig | None = None
    model: str | None = None
    max_turns: int | None = None
    max_input_tokens: int | None = None
    max_output_tokens: int | None = None
    max_total_tokens: int | None = None


class EnvConfig(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str = ""
    taskset: TasksetConfig = Field(default_factory=TasksetConfig)


class SingleAgentEnvConfig(EnvConfig):
    agent: AgentConfig = Field(default_factory=AgentConfig)


EnvConfigT = TypeVar("EnvConfigT", bound=EnvConfig, default=EnvConfig)


class Episode(BaseModel):
    """The traces of one env run on one task (for vfray: the n rollouts of a task)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    id: str = ""
    ok: bool = True
    traces: list[Any] = Field(default_factory=list)


class Env(Generic[EnvConfigT]):
    """An environment: who plays (``run``) and cross-trace judgement (``finalize``)."""

    def __init__(self, config: EnvConfigT | None = None) -> None:
        self.config: Any = config if config is not None else EnvConfig()

    async def setup(self, agents: Any) -> None:
        return None

    async def run(self, task: Any, agents: Any) -> None:
        raise NotImplementedError

    async def finalize(self, task: Any, episode: Episode) -> None:
        return None


class SingleAgentEnv(Env[SingleAgentEnvConfig]):
    """One agent runs the task once (v1's default env)."""

    async def run(self, task: Any, agents: Any) -> None:
        await agents.agent.run(task)


class BestOfNEnvConfig(SingleAgentEnvConfig):
    n: int = Field(4, ge=1)
    threshold: float = 1.0


class BestOfNEnv(Env[BestOfNEnvConfig]):
    """n independent attempts at a task, compared in ``finalize``: ``best`` marks the
    highest-reward attempt(s), ``pass_at_n`` whether any reached ``threshold``."""

    def __init__(self, config: BestOfNEnvConfig | None = None) -> None:
        super().__init__(config if config is not None else BestOfNEnvConfig())

    async def run(self, task: Any, agents: Any) -> None:
        raise RuntimeError(
            "BestOfNEnv is not run turn by turn on vfray: its n attempts are vfray's group of n "
            "rollouts (run it with -r N)"
        )

    async def finalize(self, task: Any, episode: Episode) -> None:
        top = max(t.reward for t in episode.traces)
        solved = float(top >= self.config.threshold)
        for trace in episode.traces:
            trace.record_metric("best", float(trace.reward == top))
            trace.record_metric("pass_at_n", solved)


class Harness:
    """Base of a v1 harness class; vfray runs its own harnesses (see the id mapping)."""


class ToolsetConfig(BaseModel):
    """v1's per-rollout toolset config. vfray serves every toolset on the host, per rollout:
    ``colocated`` / ``runtime`` / ``url`` other than their defaults are refused (the adapter)."""

    model_config = ConfigDict(extra="allow")

    colocated: bool = False
    runtime: dict[str, Any] = Field(default_factory=lambda: {"type": "subprocess"})
    url: str | None = None


class SharedToolsetConfig(BaseModel):
    """v1's taskset-wide toolset config, for code that names it (shared toolsets are refused)."""

    model_config = ConfigDict(extra="allow")

    runtime: dict[str, Any] = Field(default_factory=lambda: {"type": "subprocess"})
    url: str | None = None


class Toolset(VfrayToolset):
    """Base of a v1 MCP toolset: a vfray :class:`~vfray.tools.Toolset` (per rollout, served on
    the host), its ``@vf.tool`` methods its tools, advertised under v1's names:
    ``<prefix>_<tool>``, the prefix ``TOOL_PREFIX`` or the class name in snake case, bare when
    ``TOOL_PREFIX = None`` (a scripted or real model calls the names it is shown)."""

    TOOL_PREFIX: ClassVar[str | None] = ""

    def __init__(self, config: Any = None) -> None:
        self.config = config if config is not None else ToolsetConfig()

    def __class_getitem__(cls, _params: Any) -> type[Toolset]:
        # v1's Toolset is Generic in its config (``Toolset[MyConfig]``); the config is only
        # carried here, so the parametrised class is the class itself.
        return cls

    @classmethod
    def v1_prefix(cls) -> str:
        """v1's ``ServerBase.server_name``: what its tools' names start with ("" for none)."""
        if cls.TOOL_PREFIX is None:
            return ""
        return cls.TOOL_PREFIX or "".join(
            "_" + c.lower() if c.isupper() else c for c in cls.__name__
        ).lstrip("_")

    @classmethod
    def specs(cls) -> dict[str, ToolSpec]:
        prefix = cls.v1_prefix()
        if not prefix:
            return super().specs()
        return {
            f"{prefix}_{name}": dataclasses.replace(spec, name=f"{prefix}_{name}")
            for name, spec in super().specs().items()
        }

    @classmethod
    def run(cls) -> None:
        """v1 serves a toolset by running its module (``python -m``); vfray serves it itself."""
        raise ConfigError(
            f"v1 toolset {cls.__qualname__}: vfray serves v1 toolsets itself, per rollout; "
            "run the taskset with `vfray eval`"
        )
