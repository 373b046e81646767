"""The TraceSink actor: appends Arrow tables to the run folder's Parquet parts as episodes
finish, flushing by rows and by seconds, writes the run header (``config.json``) once, and on
close compacts each table's parts into one. A plain class: Ray wraps it, and it runs in-process."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from pathlib import Path
from typing import Any

import pyarrow as pa

from vfray.trace import Trace
from vfray.traces.convert import traces_to_table
from vfray.traces.io import TraceWriter, compact_parts

logger = logging.getLogger(__name__)


class TraceSink:
    """One per run. ``append`` takes Arrow tables (trace rows and episode rows)."""

    def __init__(
        self,
        run_dir: str,
        header: dict[str, Any],
        *,
        flush_rows: int = 1000,
        flush_seconds: float = 10.0,
        compact: bool = True,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        header_path = self.run_dir / "config.json"
        if not header_path.exists():
            header_path.write_text(json.dumps(header, indent=2, sort_keys=True, default=str))
        self.traces = TraceWriter(self.run_dir / "traces", flush_rows=flush_rows)
        self.episodes = TraceWriter(self.run_dir / "episodes", flush_rows=flush_rows)
        self.flush_seconds = flush_seconds
        self.compact = compact
        self._ticker: asyncio.Task[None] | None = None
        self.rows = 0
        self._seen: set[str] = set()

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.flush_seconds)
            self.traces.flush()
            self.episodes.flush()

    async def append(
        self, traces: pa.Table | None, episodes: pa.Table | None = None, key: str | None = None
    ) -> int:
        """Buffer rows; parts are written every ``flush_rows`` rows or ``flush_seconds``.

        ``key`` makes the append idempotent: a retried episode task that already delivered
        its rows is not written twice."""
        if key is not None:
            if key in self._seen:
                return self.rows
            self._seen.add(key)
        if self._ticker is None:
            self._ticker = asyncio.get_running_loop().create_task(self._tick())
        if traces is not None and traces.num_rows:
            self.traces.write(traces)
            self.rows += traces.num_rows
        if episodes is not None and episodes.num_rows:
            self.episodes.write(episodes)
        return self.rows

    async def append_rows(self, rows: tuple[pa.Table, pa.Table], key: str) -> int:
        """An episode task's rows (passed by ObjectRef, so the driver never holds them)."""
        return await self.append(rows[0], rows[1], key)

    async def append_trace(self, trace: Trace) -> int:
        """One trace row: an attempt that is retried keeps its own row."""
        return await self.append(traces_to_table([trace]))

    async def flush(self) -> int:
        self.traces.flush()
        self.episodes.flush()
        return self.rows

    async def close(self) -> int:
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
        self.traces.close()
        self.episodes.close()
        if self.compact:
            # Off the event loop: compaction reads and rewrites the whole run.
            await asyncio.to_thread(self._compact)
        return self.rows

    def _compact(self) -> None:
        """One part per table (a resumed run's new parts merge with the earlier ones)."""
        for writer in (self.traces, self.episodes):
            try:
                compact_parts(writer.directory)
            except Exception:
                # Every row is still in the parts, which readers handle; the run is not lost.
                logger.warning("could not compact %s", writer.directory, exc_info=True)
