"""Waiting on a one-shot program run in a container (a docker exec, a ``podman exec``): under
its timeout, its processes SIGKILLed through their exec marker on the host when it runs past it
or the wait is cancelled, and the tail of its output kept."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from typing import TypeVar

from vfray.runtimes._docker_exec import signal_exec
from vfray.runtimes._executor import blocking

T = TypeVar("T")


async def wait_exec(
    job: asyncio.Future[T],
    token: str,
    running: set[str],
    timeout: float | None,
    on_cancel: Callable[[], None] | None = None,
) -> tuple[T, bool]:
    """``job``'s result and whether it timed out; ``token`` is in ``running`` meanwhile."""
    running.add(token)
    timed_out = False
    try:
        result = await asyncio.wait_for(asyncio.shield(job), timeout)
    except TimeoutError:
        timed_out = True
        await kill_exec(token)
        result = await job
    except asyncio.CancelledError:
        # Cancelled (a stopped rollout's kill): the exec must not run on in the container.
        await kill_exec(token)
        if on_cancel is not None:
            on_cancel()
        raise
    finally:
        running.discard(token)
    return result, timed_out


async def kill_exec(token: str) -> None:
    """SIGKILL an exec's processes, found by their marker (the engine's ``Pid`` for an
    exec can lag behind: :mod:`vfray.runtimes._docker_exec`)."""
    await blocking(signal_exec, token, signal.SIGKILL)


def tail(data: bytes | None, cap: int) -> tuple[str, bool]:
    """The last ``cap`` bytes of ``data`` as text, and whether any were cut."""
    data = data or b""
    cut = len(data) > cap
    return data[-cap:].decode("utf-8", errors="replace"), cut
