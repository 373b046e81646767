"""What a run's driver learns about finished work, whichever backend ran it: a small
:class:`RolloutOutcome` per rollout (its progress line) and an :class:`EpisodeOutcome` per task,
plus :func:`finish_episode`, which scores a finished group and turns it into Parquet rows.

Ray-free: the in-process backend calls :func:`finish_episode` directly, the Ray backend wraps it
in a Ray task (``actors.episode``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from vfray.endpoints import answers
from vfray.episode import AdvantageEstimator, Episode, finalize_episode
from vfray.task import Task
from vfray.trace import Trace

if TYPE_CHECKING:
    import pyarrow as pa


class RolloutOutcome(BaseModel):
    """What the driver needs to know about one finished rollout (its progress line)."""

    model_config = ConfigDict(frozen=True)

    ok: bool
    reward: float | None
    error_type: str | None
    stop_condition: str | None
    input_tokens: int
    output_tokens: int
    calls_without_tokens: int = 0
    """Model calls answered without token ids: a training stream stops at the first rollout
    that has one (its samples could not be trained on)."""
    endpoint_refused: bool = False
    """Its ``ProviderError`` is the endpoint refusing its request (a 4xx but 408/429): the
    rollout's own error, neither retried nor counted as an outage by the endpoint circuit."""
    upstream_error: str | None = None
    """Its last model call's error in one short line (``HTTP 500: boom``): the progress line
    names it, so an endpoint that fails says why while the run waits."""

    @classmethod
    def of(cls, trace: Trace) -> RolloutOutcome:
        err = trace.error()
        return cls(
            ok=trace.ok,
            reward=trace.reward,
            error_type=err.type if err else None,
            stop_condition=trace.stop_condition.value if trace.stop_condition else None,
            input_tokens=trace.usage.input_tokens,
            output_tokens=trace.usage.output_tokens,
            calls_without_tokens=_calls_without_tokens(trace),
            endpoint_refused=err is not None
            and err.type == "ProviderError"
            and answers.is_refused(err.message),
            upstream_error=_upstream_error(trace),
        )

    @classmethod
    def of_game(cls, traces: list[Trace]) -> RolloutOutcome:
        """One game of a seated task (one trace per seat) as one rollout: ok when every seat
        is, the first seat error's type, the seats' mean reward and summed tokens."""
        errors = [e for e in (t.error() for t in traces) if e is not None]
        rewards = [t.reward for t in traces if t.reward is not None]
        stops = [t.stop_condition.value for t in traces if t.stop_condition is not None]
        return cls(
            ok=all(t.ok for t in traces),
            reward=sum(rewards) / len(rewards) if rewards else None,
            error_type=errors[0].type if errors else None,
            stop_condition=stops[0] if stops else None,
            input_tokens=sum(t.usage.input_tokens for t in traces),
            output_tokens=sum(t.usage.output_tokens for t in traces),
            calls_without_tokens=sum(_calls_without_tokens(t) for t in traces),
            endpoint_refused=bool(errors)
            and errors[0].type == "ProviderError"
            and answers.is_refused(errors[0].message),
            upstream_error=next(
                (e for e in map(_upstream_error, reversed(traces)) if e is not None), None
            ),
        )


def _upstream_error(trace: Trace) -> str | None:
    failed = [c.error for c in trace.calls if c.error is not None]
    return answers.short(failed[-1].message) if failed else None


def _calls_without_tokens(trace: Trace) -> int:
    return sum(
        1 for c in trace.calls if c.response_id is not None and c.completion_token_ids is None
    )


def played(handles: list[Trace | list[Trace]]) -> list[Trace]:
    """The traces of finished rollouts, a seated task's games (a list per game) flattened."""
    return [t for h in handles for t in (h if isinstance(h, list) else [h])]


class EpisodeOutcome(BaseModel):
    """The driver's view of a finished episode; ``episode`` is filled only when streaming."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    episode_id: str
    task_key: str
    rollouts: list[RolloutOutcome]
    mean_reward: float | None
    episode: Episode | None = None


@dataclass
class EpisodeGroup:
    """One task's n scored rollouts, as ``Farm.stream`` yields them."""

    episode: Episode
    on_prefix_break: str = "drop"
    """The run's ``env.on_prefix_break``: how its samples treat a branch whose ids do not line
    up (the stream's batch builders follow it unless told otherwise)."""

    @property
    def traces(self) -> list[Trace]:
        return self.episode.traces

    @property
    def table(self) -> pa.Table:
        from vfray.traces.convert import traces_to_table

        return traces_to_table(self.episode.traces)

    @property
    def rewards(self) -> list[float | None]:
        return self.episode.rewards

    @property
    def advantages(self) -> list[float | None]:
        return self.episode.advantages

    @property
    def counted(self) -> list[bool]:
        """Per rollout: whether it counts in the group (see :class:`~vfray.Episode`)."""
        return self.episode.counted

    @property
    def trainable(self) -> bool:
        """At least 2 rollouts count: the group has advantages to train on."""
        return self.episode.trainable

    @property
    def group_rewards(self) -> dict[str, list[float | None]]:
        return self.episode.group_rewards


class EpisodeSpec(BaseModel):
    """What every episode of one run shares, fixed when the run starts and passed down whole
    (to the episode Ray task, too)."""

    model_config = ConfigDict(frozen=True)

    run_id: str | None = None
    overrides: dict[str, str] = {}
    """Scoring hook overrides from the config (``env.scoring``)."""
    keep: bool = False
    """Return the scored :class:`Episode` in the outcome (streaming), not only its rows."""
    scoring_timeout: float | None = None
    """Seconds the group rewards may run (``env.timeouts.scoring``); a task's own wins."""
    count_failed: bool = False
    """Rollouts that failed for infrastructure reasons count in the group (``env.count_failed``)."""
    advantage: AdvantageEstimator = "mean"
    """How rewards become advantages (``env.advantage``)."""


class RolloutJob(BaseModel):
    """One rollout attempt, fixed when the driver submits it and passed down whole (to a
    SandboxHost too)."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    task: Task[Any]
    index: int = 0
    """The rollout's index within its task's group."""
    attempt: int = 0
    run_id: str | None = None
    episode_id: str | None = None


class EpisodeJob(BaseModel):
    """One task's group, to be scored once its rollouts are done: fixed when the driver hands
    it over and passed down whole (to the episode Ray task too)."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    task: Task[Any]
    episode_id: str
    spec: EpisodeSpec
    previous: list[Trace] = []
    """A resumed group's rollouts that already succeeded: scored with the group, not written
    again."""


EpisodeRows = tuple["pa.Table", "pa.Table"]
"""An episode's new trace rows and its episode row, on their way to the sink."""


async def finish_episode(
    job: EpisodeJob, finished: list[Trace | list[Trace]]
) -> tuple[EpisodeOutcome, EpisodeRows]:
    """Run the group rewards over ``job.previous`` + the ``finished`` rollouts' traces (a list
    per game of a seated task) and build the rows of the new traces and of the episode. A
    group reward past its deadline is recorded as ``None`` with the timeout, and the rows are
    built all the same."""
    new = played(finished)
    # Imported here, not at the top: pyarrow costs a few hundred ms of start-up that a local
    # run should not pay before its first rollout.
    from vfray.traces.convert import traces_to_table
    from vfray.traces.episodes import episodes_to_table

    task, spec = job.task, job.spec
    timeout = task.data.timeout.scoring or spec.scoring_timeout
    episode = await finalize_episode(
        task,
        [*job.previous, *new],
        spec.overrides,
        episode_id=job.episode_id,
        timeout=timeout,
        count_failed=spec.count_failed,
        estimator=spec.advantage,
    )
    episode.traces.sort(key=lambda t: t.rollout_index)  # stable: a game keeps its seat order
    outcome = EpisodeOutcome(
        episode_id=episode.episode_id,
        task_key=task.key,
        rollouts=[RolloutOutcome.of(t) for t in new],
        mean_reward=episode.mean_reward,
        episode=episode if spec.keep else None,
    )
    return outcome, (traces_to_table(new), episodes_to_table([episode], spec.run_id))
