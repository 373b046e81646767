"""The TraceSink actor: appends Arrow tables to the run folder's Parquet parts as episodes
finish, flushing by rows and by seconds, writes the run header (``config.json``) once, and on
close compacts each table's parts into one. A plain class: Ray wraps it, and it runs in-process.

Writes that fail (disk full) keep their rows buffered for the next flush and turn every later
append into a :class:`~vfray.errors.SinkError`, which stops the run. Episode rows are written
only after every trace row buffered with them is on disk: written side by side, a full disk
took the traces' part but not the smaller episodes' one, and ``vfray show`` then counted 0/0
rollouts with pass@1 = 1 (groups with an episode row and no trace rows). Appends carry a key; the
sink reports the keys whose rows are on disk, so a caller can re-send the rest to a restarted
sink, which skips rows its predecessor had already written.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
import warnings
from pathlib import Path
from typing import Any

import pyarrow as pa

from vfray.errors import SinkError
from vfray.trace import Trace
from vfray.traces.convert import traces_to_table
from vfray.traces.episodes import LATEST_BY
from vfray.traces.io import TraceWriter, compact_parts, read_parquet
from vfray.traces.parts import finish_compaction
from vfray.traces.wire import PackedRows, unpack_rows

logger = logging.getLogger(__name__)


def _restarted() -> bool:
    """True in a Ray actor that Ray restarted after it died (never in-process: no Ray there)."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return False
    context = ray.get_runtime_context()
    if context.get_actor_id() is None:
        return False  # the local backend, in a process that also uses Ray
    with warnings.catch_warnings():
        # The property reads a deprecated attribute inside Ray itself.
        warnings.simplefilter("ignore", DeprecationWarning)
        return bool(context.was_current_actor_reconstructed)


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
        for table in ("traces", "episodes"):
            finish_compaction(self.run_dir / table)
        self.traces = TraceWriter(self.run_dir / "traces", flush_rows=flush_rows)
        # Episode rows never flush on their own (see _flush_all): sys.maxsize rows.
        self.episodes = TraceWriter(self.run_dir / "episodes", flush_rows=sys.maxsize)
        self.flush_rows = flush_rows
        self.flush_seconds = flush_seconds
        self.compact = compact
        self._ticker: asyncio.Task[None] | None = None
        self.rows = 0
        self._seen: set[str] = set()
        self._pending: list[str] = []  # keys with rows still buffered
        self._durable: list[str] = []  # keys whose rows are on disk, not yet reported
        self._error: OSError | None = None
        # Rows a dead predecessor already wrote: a caller re-sends every row it was not told
        # is durable, and some of those may have reached a part before the death.
        self._written_traces: set[str] = set()
        self._written_episodes: set[tuple[str, float]] = set()
        if _restarted():
            self._load_written()

    def _load_written(self) -> None:
        from vfray.traces.episodes import EPISODE_SCHEMA
        from vfray.traces.schema import TRACE_SCHEMA

        traces = read_parquet(self.traces.directory, TRACE_SCHEMA, columns=["trace_id"])
        self._written_traces = set(traces.column("trace_id").to_pylist())
        episodes = read_parquet(
            self.episodes.directory, EPISODE_SCHEMA, columns=["episode_id", "created_at"]
        )
        self._written_episodes = set(
            zip(
                episodes.column("episode_id").to_pylist(),
                episodes.column("created_at").to_pylist(),
                strict=True,
            )
        )
        logger.warning(
            "TraceSink restarted: %d trace rows and %d episode rows already in %s",
            len(self._written_traces),
            len(self._written_episodes),
            self.run_dir,
        )

    def _unwritten(self, table: pa.Table, episodes: bool) -> pa.Table:
        if episodes:
            if not self._written_episodes:
                return table
            ids = zip(
                table.column("episode_id").to_pylist(),
                table.column("created_at").to_pylist(),
                strict=True,
            )
            mask = [row not in self._written_episodes for row in ids]
        else:
            if not self._written_traces:
                return table
            mask = [t not in self._written_traces for t in table.column("trace_id").to_pylist()]
        return table if all(mask) else table.filter(pa.array(mask, pa.bool_()))

    # -- failures -----------------------------------------------------------------------

    def _failed(self, exc: OSError) -> None:
        if self._error is None:
            logger.error(
                "cannot write rows to %s (%s); %d rows kept buffered, the run stops",
                self.run_dir,
                exc,
                self.traces.buffered_rows + self.episodes.buffered_rows,
            )
        self._error = exc

    def _sink_error(self) -> SinkError:
        held = self.traces.buffered_rows + self.episodes.buffered_rows
        return SinkError(
            f"cannot write rows to {self.run_dir} ({self._error}); the run stopped with "
            f"{held} rows unwritten; free space or fix the folder, then run "
            f"`vfray resume {self.run_dir}`"
        )

    def _flush_all(self) -> None:
        """Write the trace rows, then the episode rows; a failed write keeps its rows (and
        every episode row, when it is the traces') buffered, and is raised."""
        try:
            self.traces.flush()
            self.episodes.flush()
        except OSError as exc:
            self._settle()
            self._failed(exc)
            raise
        self._settle()

    def _settle(self) -> None:
        # A key is durable once both its trace and its episode rows are on disk: when both
        # buffers are empty (at latest every flush_seconds), every key so far is.
        if not self.traces.buffered_rows and not self.episodes.buffered_rows:
            self._durable.extend(self._pending)
            self._pending.clear()

    def _report(self) -> list[str]:
        durable, self._durable = self._durable, []
        return durable

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.flush_seconds)
            try:
                self._flush_all()
            except OSError:
                pass  # logged by _failed; the rows stay buffered for the next flush
            except Exception:
                logger.exception("TraceSink flush failed")

    # -- the API --------------------------------------------------------------------------

    async def append(
        self, traces: pa.Table | None, episodes: pa.Table | None = None, key: str | None = None
    ) -> int:
        """Buffer rows; parts are written every ``flush_rows`` rows or ``flush_seconds``.

        ``key`` makes the append idempotent: a retried episode task that already delivered
        its rows is not written twice. Raises :class:`SinkError` once a write has failed
        (the rows are kept buffered all the same)."""
        if key is not None:
            if key in self._seen:
                return self.rows
            self._seen.add(key)
            self._pending.append(key)
        if self._ticker is None:
            self._ticker = asyncio.get_running_loop().create_task(self._tick())
        failure: OSError | None = None
        for writer, table, is_episode in (
            (self.traces, traces, False),
            (self.episodes, episodes, True),
        ):
            if table is None or not table.num_rows:
                continue
            table = self._unwritten(table, is_episode)
            try:
                # write() buffers the rows before it flushes, so a failed flush keeps them.
                writer.write(table)
            except OSError as exc:
                failure = failure or exc
            if not is_episode:
                self.rows += table.num_rows
        if failure is None and self.episodes.buffered_rows >= self.flush_rows:
            try:
                self._flush_all()
            except OSError as exc:
                failure = exc
        self._settle()
        if failure is not None:
            self._failed(failure)
        if self._error is not None:
            raise self._sink_error()
        return self.rows

    async def append_rows(self, rows: PackedRows, key: str) -> list[str]:
        """An episode's rows as IPC bytes (:mod:`vfray.traces.wire`), passed by ObjectRef so
        the driver never holds them. Returns the keys whose rows became durable since the
        last call."""
        traces, episodes = unpack_rows(rows)
        await self.append(traces, episodes, key)
        return self._report()

    async def append_trace(self, trace: Trace | list[Trace], key: str | None = None) -> list[str]:
        """One attempt's rows (a game's: one per seat): an attempt that is retried keeps its
        own rows."""
        await self.append(traces_to_table(trace if isinstance(trace, list) else [trace]), None, key)
        return self._report()

    async def flush(self) -> list[str]:
        """Write every buffered row; returns the keys whose rows became durable."""
        try:
            self._flush_all()
        except OSError as exc:
            raise self._sink_error() from exc
        return self._report()

    async def close(self) -> int:
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
        try:
            self._flush_all()
        except OSError as exc:
            raise self._sink_error() from exc
        self.traces.close()
        self.episodes.close()
        if self.compact:
            # Off the event loop: compaction reads and rewrites the whole run.
            await asyncio.to_thread(self._compact)
        return self.rows

    def _compact(self) -> None:
        """One part per table (a resumed run's new parts merge with the earlier ones; its
        groups' new episode rows replace their old ones)."""
        for writer, latest_by in ((self.traces, None), (self.episodes, LATEST_BY)):
            try:
                compact_parts(writer.directory, latest_by=latest_by)
            except Exception:
                # Every row is still in the parts, which readers handle; the run is not lost.
                logger.warning("could not compact %s", writer.directory, exc_info=True)
