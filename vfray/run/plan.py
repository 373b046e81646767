"""What the run driver is asked to do: the :class:`RunPlan` of a run (its sizes, retries, scoring
and retry policy) and, per task, the :class:`ResumeState` an earlier run left behind."""

from __future__ import annotations

from dataclasses import dataclass, field

from vfray.endpoints.retry import RetryPolicy
from vfray.episode import AdvantageEstimator
from vfray.run.outcomes import EpisodeSpec
from vfray.trace import AgentInfo, Trace


@dataclass
class ResumeState:
    """What an earlier run already holds for one task: finished traces by rollout index, the
    episode id, and the next attempt number per rollout index. ``rescore``: the group's
    episode row is missing or stale, so a group with nothing to re-run is scored again."""

    episode_id: str
    done: dict[int, Trace] = field(default_factory=dict)
    next_attempt: dict[int, int] = field(default_factory=dict)
    rescore: bool = False
    games: dict[int, list[Trace]] = field(default_factory=dict)
    """A seated task's finished games by rollout index (one trace per seat, every seat ok)."""

    def finished(self) -> list[Trace]:
        return [*self.done.values(), *(t for game in self.games.values() for t in game)]


@dataclass
class RunPlan:
    run_id: str
    rollouts_per_task: int
    max_concurrent: int
    max_retries: int = 2
    scoring_overrides: dict[str, str] = field(default_factory=dict)
    agent: AgentInfo = field(default_factory=AgentInfo)
    keep_episodes: bool = False
    max_groups_in_flight: int | None = None
    """Bound on groups started but not yet delivered to ``on_episode`` (streaming: bounds how
    stale a trainer's groups can be); None means only ``max_concurrent`` rollouts bound."""
    scoring_timeout: float | None = None
    """Seconds a group's ``@group_reward`` hooks may run (the config's ``env.timeouts.scoring``)."""
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    """Backoff of provider retries and the endpoint circuit (the config's ``retry``)."""
    count_failed: bool = False
    """Infrastructure failures count in their group (``env.count_failed``)."""
    advantage: AdvantageEstimator = "mean"
    """How rewards become advantages (``env.advantage``)."""

    def episode_spec(self) -> EpisodeSpec:
        return EpisodeSpec(
            run_id=self.run_id,
            overrides=self.scoring_overrides,
            keep=self.keep_episodes,
            scoring_timeout=self.scoring_timeout,
            count_failed=self.count_failed,
            advantage=self.advantage,
        )
