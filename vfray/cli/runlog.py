"""``eval.log``: the driver's log records for one run, written into its run folder, and the
console's share of them (each warning once; its repeats only in ``eval.log``).

The run folder is only known once the farm has named it (``Farm.run(on_run_dir=...)`` says so
before the first rollout), so earlier records are buffered, then flushed into ``eval.log``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOG_NAME = "eval.log"
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
MAX_BUFFERED = 10_000
"""Records kept before the folder is known; older ones are dropped so memory stays bounded."""


class RepeatFilter(logging.Filter):
    """For the console: a warning (or lower) passes the first time its logger logs that
    message template; repeats (one per retried rollout) are counted, not shown."""

    def __init__(self) -> None:
        super().__init__()
        self._seen: set[tuple[str, str]] = set()
        self.suppressed = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.WARNING:
            return True
        key = (record.name, str(record.msg))
        if key in self._seen:
            self.suppressed += 1
            return False
        self._seen.add(key)
        return True


CONSOLE_REPEATS = RepeatFilter()
"""The filter ``vfray`` puts on its console handler; its count is reported after a run."""


class _LogFile(logging.FileHandler):
    """A FileHandler that does not print a traceback when a write fails (a full disk): the
    run reports that itself, in one line."""

    failed: OSError | None = None

    def handleError(self, record: logging.LogRecord) -> None:
        import sys

        error = sys.exc_info()[1]
        if self.failed is None and isinstance(error, OSError):
            self.failed = error


class RunLog(logging.Handler):
    """A handler that buffers until :meth:`open`, then appends to ``<run_dir>/eval.log``."""

    def __init__(self, level: int = logging.INFO) -> None:
        super().__init__(level)
        self.setFormatter(logging.Formatter(FORMAT))
        self._buffer: list[logging.LogRecord] = []
        self._file: _LogFile | None = None
        self.path: Path | None = None

    def open(self, run_dir: str | Path) -> Path:
        """Start writing into ``run_dir`` (appending: a resumed run keeps the earlier log)."""
        path = Path(run_dir) / LOG_NAME
        if self._file is not None and path == self.path:
            return path
        self.acquire()
        try:
            if self._file is not None:
                self._file.close()
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = _LogFile(path, mode="a", encoding="utf-8")
            self._file.setFormatter(self.formatter)
            self.path = path
            for record in self._buffer:
                self._file.emit(record)
            self._buffer.clear()
        finally:
            self.release()
        return path

    def emit(self, record: logging.LogRecord) -> None:
        if self._file is not None:
            self._file.emit(record)
            return
        self._buffer.append(record)
        if len(self._buffer) > MAX_BUFFERED:
            del self._buffer[0]

    def close(self) -> None:
        # logging.shutdown() calls this for every handler, and so does any library that
        # reconfigures logging mid-run (uvicorn.Config runs dictConfig, which closes all
        # existing handlers): flush, but keep writing until the run releases the file.
        if self._file is not None:
            self._file.flush()
        super().close()

    def finish(self) -> None:
        """Close ``eval.log`` at the end of the run."""
        self.acquire()
        try:
            if self._file is not None:
                self._file.close()
                self._file = None
        finally:
            self.release()


@contextmanager
def capture_run_log(level: int = logging.INFO) -> Iterator[RunLog]:
    """Attach a :class:`RunLog` to the root logger for the duration of a run.

    The root level is lowered to ``level`` so INFO records reach the file, while the console
    handlers are pinned to the level they had, so the terminal stays as quiet as before.
    """
    root = logging.getLogger()
    previous = root.level
    pinned = [h for h in root.handlers if h.level == logging.NOTSET]
    for handler in pinned:
        handler.setLevel(previous)
    handler = RunLog(level)
    root.addHandler(handler)
    root.setLevel(min(previous, level))
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        handler.finish()
        handler.close()
        root.setLevel(previous)
        for console in pinned:
            console.setLevel(logging.NOTSET)
