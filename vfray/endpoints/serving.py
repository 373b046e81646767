"""Serve an ASGI app with uvicorn on 127.0.0.1 (a thread of its own, or the current loop): the
interception endpoint, the scripted model, tests and demos.

The socket is bound before uvicorn starts, so port 0 yields a free port with no race. Every
request head is bounded in size, header count and read time (:class:`HeadLimits`), and a handler
cancelled by its server's or loop's shutdown answers 503 instead of logging a traceback. The
servers never take SIGINT/SIGTERM: the process that embeds them decides how it stops. An idle
server wakes once a second (uvicorn's own wakes ten times), and a close wakes it at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import uvicorn

from vfray.endpoints._guarded_http import HeadLimits, guarded_protocol

__all__ = ["HeadLimits", "close_abandoning", "in_loop_server", "serve_in_loop", "serve_in_thread"]


_BACKLOG = 8192
"""Pending connections the kernel queues (capped at ``net.core.somaxconn``): a node may hold
10,000 sessions, and a harness whose connect overflows the queue waits out SYN retransmits
(1 s, 3 s, 7 s...)."""


def _bind(host: str, port: int) -> socket.socket:
    # IPPROTO_TCP (not 0) so asyncio sets TCP_NODELAY: otherwise every response waits ~40 ms
    # for a delayed ACK (Nagle).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(_BACKLOG)
    sock.setblocking(False)
    return sock


_Factory = Callable[[], asyncio.Protocol]
_IN_LOOP: dict[tuple[str, int], tuple[asyncio.AbstractEventLoop, _Factory]] = {}
"""The servers :func:`serve_in_loop` runs, by host and port: their loop and protocol factory."""


def in_loop_server(host: str, port: int) -> Callable[[], asyncio.Protocol] | None:
    """The protocol factory of the server that :func:`serve_in_loop` runs at ``host:port`` on
    the running loop, or None. A box's bridge to that address hands the box's connection to
    it instead of opening a second connection to it and relaying bytes between the two (a
    model call's connect, accept and two relay tasks; the benchmark's rollouts are 3-4 calls)."""
    found = _IN_LOOP.get((host, port))
    if found is None or found[0] is not asyncio.get_running_loop():
        return None
    return found[1]


def _protocol_factory(server: uvicorn.Server) -> Callable[[], asyncio.Protocol]:
    """A connection's protocol, made as uvicorn's own listener makes it (``Server.startup``):
    the connection is the server's, tracked, limited and shut down with the rest."""
    config = server.config
    loop = asyncio.get_running_loop()

    def create() -> asyncio.Protocol:
        protocol: asyncio.Protocol = config.http_protocol_class(  # type: ignore[call-arg]
            config=config,
            server_state=server.server_state,
            app_state=server.lifespan.state,
            _loop=loop,
        )
        return protocol

    return create


class _AnswerWhenCancelled:
    """Wraps a served ASGI app. A request handler is cancelled only when its server or its loop
    shuts down: uvicorn cancels the handlers still running when its graceful shutdown ends, and
    ``asyncio.run`` cancels every task left when a coroutine returns while a server on its loop
    still has requests in flight (a training loop leaving a plain ``with vf.Farm``). uvicorn
    logs whatever leaves the app as an "Exception in ASGI application" traceback; instead the
    client gets a plain 503 when no response had started (and one log line when it had)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Any) -> None:
            nonlocal started
            started = True
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except asyncio.CancelledError:
            if started:
                return
            with contextlib.suppress(Exception):
                await send(
                    {
                        "type": "http.response.start",
                        "status": 503,
                        "headers": [(b"content-type", b"text/plain; charset=utf-8")],
                    }
                )
                await send({"type": "http.response.body", "body": b"the server is shutting down"})


class _Server(uvicorn.Server):
    """uvicorn's server without its signal capture, and without its ten ticks a second.

    On the main thread uvicorn takes SIGINT and SIGTERM for itself and shuts down at once: a
    run's interception and scripted model went away under rollouts still in flight (recorded
    as ``Connection refused``) before the run's own stop could cancel them; and it put its
    captured signal back afterwards.

    uvicorn's main loop wakes every 0.1 s to see whether ``should_exit`` was set (and to make
    the ``date`` header once a second): ~0.5 ms of the loop's CPU a second per server, idle or
    not, which at one rollout at a time was ~0.8 ms (~5%) of vfray's own CPU per goose
    rollout. Here it wakes once a second for the header, and setting ``should_exit`` (from any
    thread) wakes it at once, so a close is as quick as before."""

    _wake: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None
    _exit = False

    @property
    def should_exit(self) -> bool:
        return self._exit

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        self._exit = value
        wake = self._wake
        if value and wake is not None:
            with contextlib.suppress(RuntimeError):  # its loop closed: nothing waits
                wake[0].call_soon_threadsafe(wake[1].set)

    async def main_loop(self) -> None:
        self._wake = (asyncio.get_running_loop(), asyncio.Event())
        # A tick per second: on_tick remakes the date header when its counter is a multiple
        # of 10 (uvicorn's ticks are tenths).
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            counter = (counter + 10) % 864000
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake[1].wait(), 1.0)
            should_exit = await self.on_tick(counter)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


GRACEFUL_SHUTDOWN_S = 5.0
"""How long a closing server waits for the requests still running before it cancels them."""


def _config(app: Any, head_limits: HeadLimits | None, **uvicorn_options: Any) -> uvicorn.Config:
    # A bounded graceful shutdown: a harness blocked mid-request must not hold a close open.
    options: dict[str, Any] = {
        "log_level": "warning",
        "access_log": False,
        "lifespan": "off",
        "timeout_graceful_shutdown": GRACEFUL_SHUTDOWN_S,
        # Nothing here reads the client address: skip the X-Forwarded-For middleware per call.
        "proxy_headers": False,
        # uvicorn listens again on the socket it is given, with its own backlog (2048 unless
        # told): without this the queue set in _bind was silently cut to 2048.
        "backlog": _BACKLOG,
        "http": guarded_protocol(head_limits or HeadLimits()),
    }
    options.update(uvicorn_options)
    return uvicorn.Config(_AnswerWhenCancelled(app), **options)


@contextlib.contextmanager
def serve_in_thread(
    app: Any,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    head_limits: HeadLimits | None = None,
    **uvicorn_options: Any,
) -> Iterator[str]:
    """Run ``app`` in a daemon thread with its own event loop; yields ``http://host:port``."""
    sock = _bind(host, port)
    server = _Server(_config(app, head_limits, **uvicorn_options))
    thread = threading.Thread(
        target=lambda: asyncio.run(server.serve(sockets=[sock])), name="vfray-serve", daemon=True
    )
    thread.start()
    try:
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("server thread exited before it started")
            threading.Event().wait(0.005)
        yield f"http://{host}:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


async def close_abandoning(stack: contextlib.AsyncExitStack) -> None:
    """Close ``stack`` as a stop closes it, for an owner whose rollouts were cancelled: each
    server :func:`serve_in_loop` runs in it cancels the requests still in flight at once
    instead of waiting out its graceful shutdown for answers no one will read."""
    stop = asyncio.CancelledError()
    await stack.__aexit__(asyncio.CancelledError, stop, None)


@contextlib.asynccontextmanager
async def serve_in_loop(
    app: Any,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    head_limits: HeadLimits | None = None,
    **uvicorn_options: Any,
) -> AsyncIterator[str]:
    """Run ``app`` as a task on the current event loop; yields ``http://host:port``."""
    sock = _bind(host, port)
    server = _Server(_config(app, head_limits, **uvicorn_options))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    key: tuple[str, int] | None = None
    try:
        while not server.started:
            if task.done():
                task.result()
                raise RuntimeError("server exited before it started")
            await asyncio.sleep(0.005)
        bound = sock.getsockname()[1]
        key = (host, bound)
        _IN_LOOP[key] = (asyncio.get_running_loop(), _protocol_factory(server))
        yield f"http://{host}:{bound}"
    except BaseException:
        # Its owner leaves with an error or a stop (the run cancelled): the requests still in
        # flight were for rollouts that are gone. Waiting out the graceful shutdown for them
        # only delays the stop (by GRACEFUL_SHUTDOWN_S per server, against a slow model), and
        # uvicorn would log an ERROR line as it cancels them; cancelled now, each is answered
        # 503 by _AnswerWhenCancelled.
        for handler in list(server.server_state.tasks):
            handler.cancel()
        raise
    finally:
        if key is not None:
            _IN_LOOP.pop(key, None)
        server.should_exit = True
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, timeout=10)
        sock.close()
