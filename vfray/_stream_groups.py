"""The groups a training stream (:meth:`vfray.farm.Farm.stream`) hands its trainer: each
finished task's outcome turned into an :class:`~vfray.run.outcomes.EpisodeGroup`, held back
when it is too many policy versions old (dropped or run again), and logged when too few of its
rollouts count; and the token-id checks that refuse a stream whose endpoint gives none.

Internal: importable, but not the public API; names here may move.
"""

from __future__ import annotations

import logging
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any

from vfray.errors import ConfigError, no_token_ids
from vfray.run.outcomes import EpisodeGroup, RolloutOutcome
from vfray.run.spec import RunSpec
from vfray.run.staleness import ON_STALE, Requeue, group_staleness

log = logging.getLogger("vfray.farm")

TOKENLESS_HOSTS = frozenset({"api.openai.com", "api.anthropic.com"})
"""Endpoints that never return token ids (OpenAI's logprobs name tokens as text; Anthropic's
API has none): a training stream against them is refused before anything runs."""


def check_staleness_options(max_staleness: int | None, on_stale: str) -> None:
    if max_staleness is not None and max_staleness < 0:
        raise ConfigError(f"max_staleness must be >= 0, got {max_staleness}")
    if on_stale not in ON_STALE:
        raise ConfigError(f"on_stale must be one of {', '.join(ON_STALE)}, got {on_stale!r}")


def refuse_tokenless(spec: RunSpec) -> None:
    """Refuse, in one line, a training stream against an endpoint known to return no token
    ids: the scripted model with ``tokens=0`` (other than its ``tokens`` policy, which always
    returns them), or a provider API in :data:`TOKENLESS_HOSTS`."""
    endpoint = spec.endpoint
    scripted = endpoint.kind == "scripted" and endpoint.scripted_policy != "tokens"
    if scripted and endpoint.scripted_options.get("tokens", 1) == 0:
        raise ConfigError(no_token_ids(endpoint.model))
    host = urllib.parse.urlsplit(endpoint.base_url or "").hostname
    if endpoint.kind == "remote" and host in TOKENLESS_HOSTS:
        raise ConfigError(no_token_ids(endpoint.model))


def token_check(model: str) -> Callable[[RolloutOutcome], None]:
    """The driver's per-rollout check of a ``tokens`` stream."""

    def check_tokens(outcome: RolloutOutcome) -> None:
        # Every rollout is checked, not only the first: a group is delivered only when
        # none of its rollouts had a call answered without token ids.
        if outcome.calls_without_tokens:
            raise ConfigError(no_token_ids(model))

    return check_tokens


class GroupDelivery:
    """The driver's ``deliver`` callback of one stream: each outcome with an episode becomes a
    group, refused for staleness (``max_staleness``; ``on_stale``: drop it, or ``"rerun"`` its
    task through ``source``) or passed to ``deliver``."""

    def __init__(
        self,
        source: Requeue,
        deliver: Callable[[EpisodeGroup], Awaitable[None]],
        *,
        on_prefix_break: str,
        max_staleness: int | None,
        on_stale: str,
        policy_version: Callable[[], int | None],
        count_stale: Callable[[], None],
    ) -> None:
        self.source = source
        self.deliver = deliver
        self.on_prefix_break = on_prefix_break
        self.max_staleness = max_staleness
        self.on_stale = on_stale
        self.policy_version = policy_version
        """The current policy version, read as each group arrives."""
        self.count_stale = count_stale

    async def __call__(self, outcome: Any) -> None:
        if outcome.episode is None:
            return
        source, max_staleness = self.source, self.max_staleness
        group = EpisodeGroup(outcome.episode, self.on_prefix_break)
        key = group.episode.task.key
        age = group_staleness(group, self.policy_version())
        if max_staleness is not None and age is not None and age > max_staleness:
            self.count_stale()
            again = self.on_stale == "rerun" and source.rerun(key)
            log.warning(
                "task %s: its group is %d policy versions old (max_staleness %d): %s",
                key,
                age,
                max_staleness,
                "run again" if again else "dropped",
            )
            if not again:
                source.finished(key)
            return
        source.finished(key)
        if not group.trainable:
            log.warning(
                "task %s: %d of %d rollouts count (the others failed: %s); "
                "the group has no advantages",
                group.episode.task.key,
                sum(group.counted),
                len(group.traces),
                ", ".join(sorted({e.type for t in group.traces for e in t.errors[:1]}))
                or "no reward",
            )
        await self.deliver(group)
