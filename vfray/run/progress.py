"""Live progress of a run: done / in flight / errored, mean reward so far, rollouts/s and ETA,
the endpoint's outage and its last error, from the driver's counters. On a terminal one line
refreshes in place (rich); in a Jupyter kernel one output is updated in place (IPython's
display ids); elsewhere (CI logs, ``ray job submit``) a newline-terminated line is
printed every few seconds."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import sys
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

# rich is imported when a progress line is actually shown: `--no-progress` runs (benchmarks,
# CI, scripts) skip its import time.

PLAIN_INTERVAL = 5.0
"""Seconds between lines when the output is not a terminal."""


class Counters(Protocol):
    submitted: int
    done: int
    errored: int
    retried: int
    reward_sum: float
    rewarded: int

    @property
    def in_flight(self) -> int: ...


@dataclass(frozen=True)
class Baseline:
    """What a resumed run already holds: counted in the totals, not in the rate."""

    done: int = 0
    reward_sum: float = 0.0
    rewarded: int = 0

    @classmethod
    def of(cls, resume_state: Mapping[str, Any]) -> Baseline:
        """From the driver's resume state (task key -> ResumeState with ``done`` traces)."""
        done = [t for state in resume_state.values() for t in state.done.values()]
        rewards = [t.reward for t in done if t.reward is not None]
        return cls(len(done), float(sum(rewards)), len(rewards))


def render(
    counters: Counters, total: int | None, elapsed: float, baseline: Baseline = Baseline()
) -> str:
    """One status line. ``reward`` is the mean of the per-rollout ``reward`` (the weighted sum,
    group rewards included), the same number the results table shows."""
    rate = counters.done / elapsed if elapsed > 0 else 0.0
    done_all = baseline.done + counters.done
    done = f"{done_all}/{total}" if total else f"{done_all}"
    eta = ""
    if total and rate > 0:
        eta = f"  ETA {max(0.0, (total - done_all) / rate):.0f}s"
    rewarded = baseline.rewarded + counters.rewarded
    reward = (baseline.reward_sum + counters.reward_sum) / rewarded if rewarded else None
    line = (
        f"rollouts {done}  in flight {counters.in_flight}  errored {counters.errored}"
        f"  retried {counters.retried}  reward {'-' if reward is None else f'{reward:.3f}'}"
        f"  {rate:.1f}/s{eta}"
    )
    if (down := getattr(counters, "endpoint_down_since", None)) is not None:
        line += f"  endpoint down {time.time() - down:.0f}s"
    if (upstream := getattr(counters, "last_upstream_error", None)) is not None:
        # The cause, while it matters: an endpoint answering 500s or 404s says why at once
        # instead of in the results table at the end.
        line += f"  last upstream error: {upstream}"
    return line


@contextlib.asynccontextmanager
async def live_progress(
    counters: Counters,
    total: int | None,
    *,
    enabled: bool = True,
    console: Any = None,
    baseline: Baseline = Baseline(),
    interval: float = PLAIN_INTERVAL,
) -> AsyncIterator[None]:
    """Show progress while the block runs (only when ``enabled``)."""
    if not enabled:
        yield
        return
    started = time.monotonic()

    def line() -> str:
        return render(counters, total, time.monotonic() - started, baseline)

    if console is None and _in_jupyter_kernel():
        async with _notebook_live(line):
            yield
        return
    from rich.console import Console

    # Jupyter reached another way (a console given by the caller): rich's Live needs
    # ipywidgets there, and shows an empty box without it; print plainly instead.
    jupyter = None if importlib.util.find_spec("ipywidgets") else False
    console = console or Console(file=sys.stderr, force_jupyter=jupyter)

    if console.is_terminal or console.is_jupyter:
        async with _live(console, line):
            yield
        return
    # Not a terminal: rich's Live would print one line at the very end, without a newline.
    stream = console.file

    async def ticker() -> None:
        while True:
            await asyncio.sleep(interval)
            print(line(), file=stream, flush=True)

    task = asyncio.ensure_future(ticker())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        print(line(), file=stream, flush=True)


NOTEBOOK_INTERVAL = 1.0
"""Seconds between updates of the notebook's progress output."""


def _in_jupyter_kernel() -> bool:
    """True inside a Jupyter kernel (IPython with a kernel; not the terminal IPython)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return shell is not None and getattr(shell, "kernel", None) is not None


@contextlib.asynccontextmanager
async def _notebook_live(line: Any) -> AsyncIterator[None]:
    """One output in the cell, replaced in place (a display id and ``update_display``), so a
    run shows one live line instead of a line every few seconds; no ipywidgets needed."""
    from IPython.display import display, update_display

    display_id = f"vfray-progress-{id(line):x}-{time.monotonic_ns()}"

    def show(update: bool) -> None:
        data = {"text/plain": line()}
        if update:
            update_display(data, raw=True, display_id=display_id)  # type: ignore[no-untyped-call]
        else:
            display(data, raw=True, display_id=display_id)  # type: ignore[no-untyped-call]

    show(False)

    async def refresh() -> None:
        while True:
            await asyncio.sleep(NOTEBOOK_INTERVAL)
            show(True)

    ticker = asyncio.ensure_future(refresh())
    try:
        yield
    finally:
        ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ticker
        show(True)


@contextlib.asynccontextmanager
async def _live(console: Any, line: Any) -> AsyncIterator[None]:
    from rich.live import Live
    from rich.text import Text

    with Live(Text(line()), console=console, refresh_per_second=4, transient=False) as live:

        async def refresh() -> None:
            while True:
                await asyncio.sleep(0.25)
                live.update(Text(line()))

        ticker = asyncio.ensure_future(refresh())
        try:
            yield
        finally:
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker
            live.update(Text(line()))
