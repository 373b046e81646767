"""What ``vfray eval`` and ``vfray resume`` do around a run: say what start-up is doing, turn
Ctrl-C and SIGTERM into a clean stop that names the run folder and the ``vfray resume``
command, and report a full disk or a Ray that fails to start in one line."""

from __future__ import annotations

import asyncio
import errno
import os
import shlex
import signal
import sys
import threading
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

from vfray._sync import cancel_runs
from vfray.config import EvalConfig
from vfray.errors import VfrayError

_stop_signal: list[int] = []
"""The signal that is stopping the run (the first one received), empty while none has."""


def _on_stop_signal(signum: int, frame: FrameType | None) -> None:
    # SIGTERM and Ctrl-C take one path: the run's coroutine is cancelled directly, so the
    # driver cancels every rollout, the farm tears every box down and flushes its rows. Not by
    # re-sending SIGINT, which a job started in the background (`cmd &` in a script) ignores;
    # and not Ray's own driver handler (sys.exit from inside the loop), which skips that
    # clean-up and prints a C++ stack on the way out.
    if _stop_signal:
        if signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: stop now, clean-up or not
        return  # already stopping (a scheduler repeating its SIGTERM)
    _stop_signal.append(signum)
    if not cancel_runs():
        raise KeyboardInterrupt  # no run yet (Ray starting, tasks loading): stop right here


def handle_stop_signals() -> None:
    """SIGTERM, and SIGINT unless this process started with it ignored (a background job's
    convention), stop the run. Called again once Ray is up: ``ray.init`` replaces the SIGTERM
    handler with its own."""
    if threading.current_thread() is not threading.main_thread():
        return
    signal.signal(signal.SIGTERM, _on_stop_signal)
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, _on_stop_signal)


def startup_message(config: EvalConfig) -> str | None:
    """What the next seconds of silence are (Ray's start-up takes 5-20 s)."""
    if config.backend == "local":
        return None
    address = config.address or os.environ.get("RAY_ADDRESS")
    if address:
        return f"connecting to the Ray cluster at {address}…"
    return "starting a local Ray (5-20 s)…"


def resume_hint(run_dir: Path | None) -> str:
    if run_dir is None:
        return "no rollout had started"
    return f"run folder: {run_dir}\nresume with: vfray resume {shlex.quote(str(run_dir))}"


def disk_full(exc: BaseException) -> OSError | None:
    """The ENOSPC error behind ``exc``, following causes (Ray wraps an actor's error in a
    RayTaskError whose ``cause`` is the original)."""
    seen: set[int] = set()
    stack: list[BaseException | None] = [exc]
    while stack:
        item = stack.pop()
        if item is None or id(item) in seen:
            continue
        seen.add(id(item))
        # An actor's error re-raised by Ray is an OSError subclass without its errno.
        if isinstance(item, OSError) and (
            item.errno == errno.ENOSPC or "No space left on device" in str(item)
        ):
            return item
        stack += [item.__cause__, item.__context__, getattr(item, "cause", None)]
        stack += list(getattr(item, "exceptions", None) or [])  # an exception group
    return None


def raised_by_ray(exc: BaseException) -> bool:
    """Whether ``exc`` came out of Ray's own code (its start-up failing on a busy machine)."""
    frames = traceback.extract_tb(exc.__traceback__)
    marker = f"{os.sep}ray{os.sep}"
    return any(marker in f.filename for f in frames) and not isinstance(exc, VfrayError)


class RunStopped(Exception):
    """The run ended early for a reason the user can act on; ``code`` is the exit status."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


@contextmanager
def guarded_run(run_dir: list[Path]) -> Iterator[None]:
    """Around ``Farm.run``: ``run_dir`` is filled (by ``on_run_dir``) once the folder is named.
    Ctrl-C / SIGTERM and a full disk become :class:`RunStopped` with the resume command; the
    signal handlers in place before are put back on the way out."""
    _stop_signal.clear()
    before = (
        {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
        if threading.current_thread() is threading.main_thread()
        else {}
    )
    handle_stop_signals()
    try:
        yield
    except (KeyboardInterrupt, asyncio.CancelledError) as exc:
        if isinstance(exc, asyncio.CancelledError) and not _stop_signal:
            raise
        where = resume_hint(run_dir[0] if run_dir else None)
        terminated = _stop_signal[:1] == [signal.SIGTERM]
        what = "terminated (SIGTERM)" if terminated else "interrupted"
        raise RunStopped(
            f"{what}; rows written so far are kept\n{where}", 143 if terminated else 130
        ) from None
    except SystemExit as exc:
        # SIGTERM while ray.init held its own handler.
        if exc.code != signal.SIGTERM:
            raise
        raise RunStopped(
            f"terminated (SIGTERM) while starting\n{resume_hint(run_dir[0] if run_dir else None)}",
            143,
        ) from None
    except Exception as exc:
        full = disk_full(exc)
        if full is None and not run_dir and raised_by_ray(exc):
            message = " ".join(str(exc).split())[:300] or type(exc).__name__
            raise RunStopped(
                f"error: starting on Ray failed: {message} (on one machine, --backend local runs "
                "without Ray)",
                1,
            ) from None
        if full is None:
            raise
        if not run_dir:
            raise RunStopped("error: no space left on device in the output folder", 1) from None
        folder = shlex.quote(str(run_dir[0]))
        raise RunStopped(
            f"error: no space left on device while writing the run folder {run_dir[0]}; "
            f"free some space, then: vfray resume {folder}",
            1,
        ) from None
    finally:
        for sig, handler in before.items():
            if handler is not None:
                signal.signal(sig, handler)


def print_stopped(stop: RunStopped) -> int:
    lines = str(stop).splitlines()
    print(f"vfray: {lines[0]}", file=sys.stderr)
    for line in lines[1:]:
        print(line, file=sys.stderr)
    return stop.code
