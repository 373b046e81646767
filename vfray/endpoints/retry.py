"""How the run driver rides out a model endpoint outage: the :class:`RetryPolicy` record (the
config tree's ``retry`` section), exponential backoff with jitter for rollouts that failed with a
``ProviderError``, and an :class:`EndpointCircuit` that holds new starts while the endpoint is
down.

Why: retried at once, a rollout spends its whole retry budget inside a 15 s outage (71 of 800
rollouts failed for good in one). With backoff a retry lands after the outage; with the circuit,
K provider failures in a row stop new rollouts from starting (and failing) until one probe
rollout gets through.

A request the endpoint answers 500 every time (a poisoned prompt) is not an outage: its K
failures in a row all come from one task, and the endpoint answers everyone else. Without telling
the two apart, the only rollouts in flight being one poisoned group opened the circuit and those
rollouts then waited on it without spending their budgets, until ``max_outage`` (900 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time

from pydantic import BaseModel, ConfigDict, Field


class RetryPolicy(BaseModel):
    """Retries of rollouts whose model endpoint failed, and when to stop starting new ones."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    provider_retries: int = Field(
        6, ge=0, description="retries of a rollout that failed with a ProviderError"
    )
    backoff: float = Field(
        1.0, gt=0, description="seconds before the first provider retry; doubles each time"
    )
    max_backoff: float = Field(30.0, gt=0, description="longest wait between provider retries")
    circuit_failures: int = Field(
        5, ge=0, description="provider failures in a row that hold new starts (0: never)"
    )
    max_outage: float = Field(
        900.0, gt=0, description="seconds the endpoint may be down before rollouts stop waiting"
    )

    def delay(self, retry: int, rng: random.Random | None = None) -> float:
        """Seconds to wait before provider retry number ``retry`` (1, 2, …): exponential,
        capped, with jitter in [50%, 100%] so the retries of one outage do not land at once."""
        base = min(self.max_backoff, self.backoff * float(2 ** max(0, retry - 1)))
        jitter = rng.uniform(0.5, 1.0) if rng is not None else random.uniform(0.5, 1.0)
        return base * jitter


class EndpointCircuit:
    """The model endpoint's health as the driver sees it, from rollout outcomes.

    Closed: rollouts start freely. After ``circuit_failures`` provider failures in a row it
    opens: rollouts wait in :meth:`admit`, and one waiter per cool-down (``backoff``, doubling
    with each failed probe up to ``max_backoff``) goes as a probe. Probes are paced, not one at a
    time: an agent rollout may take minutes to report, and the endpoint may be back long before.
    A rollout that ends without a provider failure closes the circuit. Once the endpoint has been
    down ``max_outage`` seconds the circuit stops holding rollouts (they fail through their retry
    budgets) until one succeeds.

    Each outcome names its ``source`` (the task: its rollouts send the same request). When the
    last K failures in a row, while the circuit is closed, all come from one source, that source
    is judged *poisoned*, not the endpoint down: the circuit does not open, the source's failures
    stop counting, and :meth:`poisoned` tells the driver to stop retrying its rollouts. An outage
    is failures across distinct sources. Once the circuit is open, failures judge nothing: its
    one probe at a time is often the same task's, and in an outage that task's probes fail as
    surely as a poisoned one's (a test run of a real outage lost 2 of 60 rollouts that way).
    (An outage met while one task's rollouts are the only ones in flight still looks the same as
    a poisoned request; a success of the source clears the judgement.)
    """

    def __init__(self, policy: RetryPolicy) -> None:
        self.policy = policy
        self.down_since: float | None = None
        """Wall-clock time the endpoint was judged down (None while it is up)."""
        self._streak: list[str | None] = []
        """The sources of the provider failures in a row since the last success."""
        self._poisoned: set[str] = set()
        self._opened_at = 0.0  # monotonic
        self._cooldown = policy.backoff
        self._probe_at = 0.0
        self._changed = asyncio.Event()

    @property
    def holding(self) -> bool:
        """Whether new rollouts wait now."""
        if self.down_since is None:
            return False
        return time.monotonic() - self._opened_at < self.policy.max_outage

    async def admit(self) -> bool:
        """Wait until a rollout may start; True when it goes as a probe (report its outcome
        with ``probe=True``, or :meth:`abandon` it)."""
        while self.holding:
            now = time.monotonic()
            if now >= self._probe_at:
                self._probe_at = now + self._cooldown
                return True
            self._changed.clear()
            left = min(self._probe_at, self._opened_at + self.policy.max_outage) - now
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), max(0.01, left))
        return False

    def poisoned(self, source: str) -> bool:
        """Whether ``source``'s requests were judged poisoned: it alone failed K times in a
        row, so its failures are its own, not the endpoint's."""
        return source in self._poisoned

    def _close(self) -> None:
        if self.down_since is not None:
            self.down_since = None
            self._changed.set()

    def record(self, provider_failed: bool, probe: bool = False, source: str | None = None) -> None:
        """One rollout attempt's outcome, from ``source`` (its task's key; None: unknown, never
        judged poisoned). An attempt lost with its host says nothing about the endpoint:
        :meth:`abandon` its probe instead."""
        if not provider_failed:
            self._streak.clear()
            if source is not None:
                self._poisoned.discard(source)
            self._close()
            return
        if source is not None and source in self._poisoned:
            return  # a poisoned request's failure says nothing about the endpoint
        self._streak.append(source)
        k = self.policy.circuit_failures
        if (
            k
            and source is not None
            # Judged only while the endpoint is taken to be up: during an outage the circuit
            # lets one probe through at a time, often the same task's, and its failures say
            # the endpoint is still down, not that the task is poisoned.
            and not probe
            and self.down_since is None
            and len(self._streak) >= k
            and all(s == source for s in self._streak[-k:])
        ):
            # K in a row from one request, and none from anyone else: that request, not the
            # endpoint. Its failures leave the streak (and stop holding everyone).
            self._poisoned.add(source)
            self._streak = [s for s in self._streak if s != source]
            self._close()
            return
        now = time.monotonic()
        if self.down_since is None:
            if k and len(self._streak) >= k:
                self.down_since = time.time()
                self._opened_at = now
                self._cooldown = self.policy.backoff
                self._probe_at = now + self._cooldown
        elif probe:
            self._cooldown = min(self.policy.max_backoff, self._cooldown * 2)
            self._probe_at = max(self._probe_at, now + self._cooldown)

    def abandon(self, probe: bool) -> None:
        """A probe that ended without telling anything (cancelled, its host lost): the next
        waiter may probe at once."""
        if probe and self.down_since is not None:
            self._probe_at = time.monotonic()
            self._changed.set()
