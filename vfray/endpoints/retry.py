"""How the run driver rides out a model endpoint outage: the :class:`RetryPolicy` record (the
config tree's ``retry`` section), exponential backoff with jitter for rollouts that failed with a
``ProviderError``, and an :class:`EndpointCircuit` that holds new starts while the endpoint is
down.

Why: retried at once, a rollout spends its whole retry budget inside a 15 s outage (71 of 800
rollouts failed for good in one). With backoff a retry lands after the outage; with the circuit,
K provider failures in a row stop new rollouts from starting (and failing) until one probe
rollout gets through.
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
    """

    def __init__(self, policy: RetryPolicy) -> None:
        self.policy = policy
        self.down_since: float | None = None
        """Wall-clock time the endpoint was judged down (None while it is up)."""
        self._failures = 0
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

    def record(self, provider_failed: bool, probe: bool = False) -> None:
        """One rollout attempt's outcome (an attempt lost with its host says nothing about the
        endpoint: :meth:`abandon` its probe instead)."""
        if not provider_failed:
            self._failures = 0
            if self.down_since is not None:
                self.down_since = None
                self._changed.set()
            return
        self._failures += 1
        now = time.monotonic()
        if self.down_since is None:
            if self.policy.circuit_failures and self._failures >= self.policy.circuit_failures:
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
