"""Live progress of a run with rich: done / in flight / errored, mean reward so far, rollouts/s
and ETA, refreshed a few times a second from the driver's counters."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import sys
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from rich.text import Text

# rich is imported when a progress line is actually shown: `--no-progress` runs (benchmarks,
# CI, scripts) skip its import time.


class Counters(Protocol):
    submitted: int
    done: int
    errored: int
    retried: int

    @property
    def in_flight(self) -> int: ...

    @property
    def mean_reward(self) -> float | None: ...


def render(counters: Counters, total: int | None, elapsed: float) -> Text:
    rate = counters.done / elapsed if elapsed > 0 else 0.0
    done = f"{counters.done}/{total}" if total else f"{counters.done}"
    eta = ""
    if total and rate > 0:
        eta = f"  ETA {max(0.0, (total - counters.done) / rate):.0f}s"
    reward = counters.mean_reward
    line = (
        f"rollouts {done}  in flight {counters.in_flight}  errored {counters.errored}"
        f"  retried {counters.retried}  reward {'-' if reward is None else f'{reward:.3f}'}"
        f"  {rate:.1f}/s{eta}"
    )
    if (down := getattr(counters, "endpoint_down_since", None)) is not None:
        line += f"  endpoint down {time.time() - down:.0f}s"
    from rich.text import Text

    return Text(line)


@contextlib.asynccontextmanager
async def live_progress(
    counters: Counters, total: int | None, *, enabled: bool = True, console: Any = None
) -> AsyncIterator[None]:
    """Show a live status line while the block runs (only when ``enabled``)."""
    if not enabled:
        yield
        return
    from rich.console import Console
    from rich.live import Live

    # In Jupyter without ipywidgets rich's Live shows an empty box: print plainly instead.
    jupyter = None if importlib.util.find_spec("ipywidgets") else False
    console = console or Console(file=sys.stderr, force_jupyter=jupyter)
    started = time.monotonic()
    with Live(
        render(counters, total, 0.0), console=console, refresh_per_second=4, transient=False
    ) as live:

        async def refresh() -> None:
            while True:
                await asyncio.sleep(0.25)
                live.update(render(counters, total, time.monotonic() - started))

        ticker = asyncio.ensure_future(refresh())
        try:
            yield
        finally:
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker
            live.update(render(counters, total, time.monotonic() - started))
