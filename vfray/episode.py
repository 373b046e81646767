"""Episodes: the n traces of one task, their group rewards, pass@k and RL advantages (per seat
in a multi-agent episode).

:func:`finalize_episode` is what runs once all n rollouts of a task are done: it runs the
task's ``@group_reward`` hooks over the rollouts that count, stamps each trace with the episode
id and its advantage, and returns the :class:`Episode` record. A rollout that failed for a
reason outside the policy (:func:`infra_failure`) does not count by default.

Advantages are computed here and nowhere else (:func:`group_advantages`), with the estimator
the config names (``env.advantage``).

Internal: importable, but not the public API (:mod:`vfray`, :mod:`vfray.testing`,
:mod:`vfray.train`, :mod:`vfray.compat.v1`); names here may move.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal, get_args

from pydantic import BaseModel, Field, computed_field

from vfray._hook_calls import run_levels
from vfray.scoring import (
    HookKind,
    Overrides,
    select_hooks,
    spread_keys,
    store_score,
    to_score,
    validate_group_config,
)
from vfray.task import Task
from vfray.trace import TaskRecord, Trace, new_id

INFRA_ERRORS = frozenset(
    {
        "SandboxError",
        "ProviderError",
        "InterceptionError",
        "InfrastructureError",
        "HarnessError",
        "TaskError",
    }
)
"""Error types that say nothing about the policy: the box, the endpoint, the interception, an
actor, the agent program or the task's own code failed. A phase timeout counts only outside
the agent phase (a policy that loops until its deadline is evidence about the policy)."""


AdvantageEstimator = Literal["mean", "grpo", "dr_grpo", "rloo"]
"""How a group's rewards become advantages (:func:`group_advantages`)."""

ADVANTAGE_ESTIMATORS: tuple[str, ...] = get_args(AdvantageEstimator)

RUN_MARK = "#"
"""Separates a seat's name from its run number on the traces of a seat run more than once in
one game (``solver``, ``solver#2``, ...; :mod:`vfray.harnesses.seats`)."""


def seat_role(seat: str | None) -> str | None:
    """The declared seat a trace's ``seat`` names: ``solver#2`` (its second run) → ``solver``.
    Per-seat groups, advantages and figures pool a seat's runs."""
    return None if seat is None else seat.split(RUN_MARK, 1)[0]


GRPO_EPS = 1e-6
"""Added to the standard deviation by ``grpo`` (as verl does), so a group whose rewards are
all equal gets advantages of 0, not a division by zero."""


def group_advantages(
    rewards: Sequence[float], estimator: AdvantageEstimator = "mean"
) -> list[float]:
    """The advantages of one group's ``n >= 2`` rewards ``r_1 .. r_n`` (the rollouts that
    count), with ``mean = (1/n) * sum_j r_j``:

    - ``mean`` (the default) and ``dr_grpo``: ``A_i = r_i - mean``. Dr. GRPO (Liu et al.,
      2025, "Understanding R1-Zero-like training") is GRPO without the division by the std;
      its other half, summing the token losses over a constant instead of averaging each
      sequence over its own length, is the trainer's loss, not an advantage.
    - ``grpo`` (Shao et al., 2024): ``A_i = (r_i - mean) / (std + 1e-6)`` with the sample
      standard deviation ``std = sqrt(sum_j (r_j - mean)^2 / (n - 1))``, as verl and TRL
      compute it (``torch.std``).
    - ``rloo`` (Ahmadian et al., 2024): ``A_i = r_i - (1/(n-1)) * sum_{j != i} r_j``, the
      leave-one-out baseline, equal to ``n/(n-1) * (r_i - mean)``.

    A group whose rewards are all equal gets 0 everywhere under every estimator: it carries
    no signal (``vfray.train``'s dynamic sampling drops such groups, as DAPO does).
    """
    n = len(rewards)
    if n < 2:
        raise ValueError(f"advantages need at least 2 rewards in a group; got {n}")
    if estimator not in ADVANTAGE_ESTIMATORS:
        raise ValueError(
            f"unknown advantage estimator {estimator!r}; expected one of "
            + ", ".join(ADVANTAGE_ESTIMATORS)
        )
    mean = sum(rewards) / n
    centred = [r - mean for r in rewards]
    if estimator == "grpo":
        std = math.sqrt(sum(c * c for c in centred) / (n - 1))
        return [c / (std + GRPO_EPS) for c in centred]
    if estimator == "rloo":
        return [c * n / (n - 1) for c in centred]
    return centred


def infra_failure(trace: Trace) -> bool:
    """Whether ``trace`` failed for a reason outside the policy (see :data:`INFRA_ERRORS`)."""
    err = trace.error()
    if err is None:
        return False
    if err.type == "PhaseTimeoutError":
        return err.phase != "agent"
    return err.type in INFRA_ERRORS


class Episode(BaseModel):
    """The n rollouts of one task.

    A rollout *counts* when it has a reward, its seat trains the policy
    (``trace.agent.trainable``; a judge seat does not) and, unless ``count_failed``, did not
    fail for a reason outside the policy (:func:`infra_failure`): only counted rollouts enter
    the mean and
    get an advantage; the others keep their rows and their own reward, with advantage ``None``.
    A group with fewer than 2 counted rollouts has no advantages at all (nothing to compare):
    ``trainable`` is False. A trace without a reward counts as a failure for
    :meth:`pass_at_k`.
    """

    episode_id: str = Field(default_factory=new_id)
    task: TaskRecord
    traces: list[Trace] = Field(default_factory=list)
    group_rewards: dict[str, list[float | None]] = Field(default_factory=dict)
    count_failed: bool = False
    """Count rollouts that failed for infrastructure reasons too (the config's
    ``env.count_failed``)."""
    estimator: AdvantageEstimator = "mean"
    """How rewards become advantages (the config's ``env.advantage``; :func:`group_advantages`)."""

    @computed_field  # type: ignore[prop-decorator]
    @property
    def rewards(self) -> list[float | None]:
        """Each trace's total reward (group rewards included once they ran)."""
        return [t.reward for t in self.traces]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def counted(self) -> list[bool]:
        """Per trace: whether it enters the group's mean and advantages."""
        return [
            t.reward is not None
            and t.agent.trainable
            and (self.count_failed or not infra_failure(t))
            for t in self.traces
        ]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def mean_reward(self) -> float | None:
        """The mean reward of the counted rollouts."""
        scored = [t.reward for t, c in zip(self.traces, self.counted, strict=True) if c]
        return sum(scored) / len(scored) if scored else None  # type: ignore[arg-type]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def trainable(self) -> bool:
        """At least 2 counted rollouts: the group says something about the policy."""
        return sum(self.counted) >= 2

    @computed_field  # type: ignore[prop-decorator]
    @property
    def advantages(self) -> list[float | None]:
        """The counted rollouts' advantages under :attr:`estimator` (:func:`group_advantages`;
        by default reward minus the group's mean reward), in a trainable group; ``None``
        otherwise. In a multi-agent episode
        the group is the counted traces of the same seat: each seat is its own policy's sample,
        so a proposer is not compared with a solver (a seat with fewer than 2 has none)."""
        out: list[float | None] = [None] * len(self.traces)
        if not self.trainable:
            return out
        counted = self.counted
        roles = [seat_role(t.seat) for t in self.traces]
        for seat in set(roles):
            members = [i for i, role in enumerate(roles) if role == seat and counted[i]]
            if len(members) < 2:
                continue
            rewards = [self.traces[i].reward or 0.0 for i in members]
            for i, advantage in zip(
                members, group_advantages(rewards, self.estimator), strict=True
            ):
                out[i] = advantage
        return out

    def pass_at_k(self, k: int, threshold: float = 1.0) -> float:
        """Unbiased pass@k (Chen et al., 2021): ``1 - C(n-c, k) / C(n, k)``.

        A trace passes when it is ok and its reward is at least ``threshold``: an errored
        rollout is a failure whatever reward it was left with.
        """
        return _pass_at_k(_passing(self.traces), k, threshold)

    def seat_figures(self) -> list[SeatFigures]:
        """A multi-agent episode's reward figures per seat (in seating order of first
        appearance), each over that seat's traces only (all its runs: ``solver``, ``solver#2``);
        empty when no trace has a seat."""
        roles = [seat_role(t.seat) for t in self.traces]
        seats = list(dict.fromkeys(r for r in roles if r is not None))
        out = []
        for seat in seats:
            own = [t for t, r in zip(self.traces, roles, strict=True) if r == seat]
            scored = [t.reward for t in own if t.reward is not None]
            rewards = _passing(own)
            out.append(
                SeatFigures(
                    seat=seat,
                    n=len(own),
                    mean_reward=sum(scored) / len(scored) if scored else None,
                    pass_at_1=_pass_at_k(rewards, 1),
                    pass_at_n=_pass_at_k(rewards, len(own)),
                    num_ok=sum(1 for t in own if t.ok),
                )
            )
        return out


class SeatFigures(BaseModel):
    """One seat's share of a multi-agent episode: its n traces' mean reward, pass@k, ok count."""

    seat: str
    n: int
    mean_reward: float | None
    pass_at_1: float
    pass_at_n: float
    num_ok: int


def _passing(traces: Sequence[Trace]) -> list[float | None]:
    """Each trace's reward for pass@k, None for an errored one."""
    return [t.reward if t.ok else None for t in traces]


def _pass_at_k(rewards: Sequence[float | None], k: int, threshold: float = 1.0) -> float:
    n = len(rewards)
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n; got k={k}, n={n}")
    c = sum(1 for r in rewards if r is not None and r >= threshold)
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def _column(raw: Any, n: int) -> list[tuple[float | None, str | None]]:
    """A group reward's per-trace values; a wrong shape or length fails the whole column."""
    if isinstance(raw, BaseException) or raw is None:
        return [to_score(raw)] * n
    if isinstance(raw, str | bytes | Mapping) or not isinstance(raw, Sequence):
        return [(None, f"expected a list of {n} values, got {type(raw).__name__}")] * n
    if len(raw) != n:
        return [(None, f"returned {len(raw)} values for {n} traces")] * n
    return [to_score(item) for item in raw]


async def score_group(
    task: Task[Any],
    traces: Sequence[Trace],
    overrides: Overrides | None = None,
    timeout: float | None = None,
    *,
    count_failed: bool = True,
) -> dict[str, list[float | None]]:
    """Run the ``@group_reward`` hooks over the n traces of one task; one value per trace and key.

    Each value is also written to its trace as ``RewardRecord(group=True)``; a hook that fails,
    returns the wrong number of values or is still running after ``timeout`` seconds yields
    ``None`` for every trace with the error recorded. Unless ``count_failed``, the hooks see
    only the traces that did not fail for infrastructure reasons, and the others get no group
    reward; with fewer than 2 of those left the hooks do not run.
    """
    hooks = select_hooks(task, overrides, HookKind.GROUP_REWARD)
    if hooks:
        validate_group_config(type(task), len(traces), overrides)
    keep = [i for i, t in enumerate(traces) if count_failed or not infra_failure(t)]
    if hooks and len(keep) < 2:
        return {}
    scored = [traces[i] for i in keep]
    n = len(scored)
    out: dict[str, list[float | None]] = {}
    available = {"traces": scored, "task": task}
    async for level in run_levels(hooks, task, available, True, timeout):
        for hook, result in level:
            for key, raw in spread_keys(hook, result).items():
                column = _column(raw, n)
                values: list[float | None] = [None] * len(traces)
                for i, trace, (value, error) in zip(keep, scored, column, strict=True):
                    values[i] = value
                    store_score(trace, hook, key, value, error)
                out[key] = values
    return out


async def finalize_episode(
    task: Task[Any],
    traces: Sequence[Trace],
    overrides: Overrides | None = None,
    episode_id: str | None = None,
    timeout: float | None = None,
    *,
    count_failed: bool = False,
    estimator: AdvantageEstimator = "mean",
) -> Episode:
    """Run the task's group rewards over its traces (abandoning any still running after
    ``timeout`` seconds) and build the :class:`Episode`.

    Stamps every trace with ``episode_id`` (a resumed group keeps the id its traces share) and
    its ``advantage`` (under ``estimator``: :func:`group_advantages`). ``count_failed``:
    rollouts that failed for infrastructure reasons count too (see :class:`Episode`).
    """
    if episode_id is None:
        ids = {t.episode_id for t in traces}
        shared = ids.pop() if len(ids) == 1 else None
        episode_id = shared or new_id()
    group = (
        await _score_groups(task, traces, overrides, timeout, count_failed=count_failed)
        if traces
        else {}
    )
    episode = Episode(
        episode_id=episode_id,
        task=task.record(),
        traces=list(traces),
        group_rewards=group,
        count_failed=count_failed,
        estimator=estimator,
    )
    for trace, advantage in zip(episode.traces, episode.advantages, strict=True):
        trace.episode_id = episode_id
        trace.advantage = advantage
    return episode


async def _score_groups(
    task: Task[Any],
    traces: Sequence[Trace],
    overrides: Overrides | None,
    timeout: float | None,
    *,
    count_failed: bool,
) -> dict[str, list[float | None]]:
    """The group rewards of all ``traces``; in a multi-agent episode each seat's traces are
    their own group (as for advantages: a proposer is not compared with a solver), the values
    laid back out in the traces' order."""
    roles = [seat_role(t.seat) for t in traces]
    seats = list(dict.fromkeys(roles))
    if seats == [None]:
        return await score_group(task, traces, overrides, timeout, count_failed=count_failed)
    out: dict[str, list[float | None]] = {}
    for seat in seats:
        places = [i for i, r in enumerate(roles) if r == seat]
        scored = await score_group(
            task, [traces[i] for i in places], overrides, timeout, count_failed=count_failed
        )
        for key, values in scored.items():
            column = out.setdefault(key, [None] * len(traces))
            for i, value in zip(places, values, strict=True):
                column[i] = value
    return out
