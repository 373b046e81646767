"""A bwrap box's own network namespace, made and served by the box's owner (as root).

Without it each ``run`` of a box with a bridge (every box: its egress gate is one) gets a fresh
network namespace from ``bwrap --unshare-net`` and starts through the in-box forwarder
(:data:`vfray.runtimes.bridge.BOX_FORWARDER`), a Python that listens on the bridged ports first:
~13 ms of interpreter start per command even with nothing imported. Here the owner makes one
namespace per box instead (``unshare(CLONE_NEWNET)`` in a thread of its own that then returns to
the owner's namespace), brings its loopback up, and listens on the bridged ports *inside* it
from its own event loop: a socket stays in the namespace it was made in (made by a thread that
stays in the box's namespace while the box has listeners). The box's programs
join it with ``nsenter --net`` before ``bwrap --share-net``, so a command starts with no Python in
front of it; a connection to a bridged port is served by the bridge itself, with no in-box hop.

One namespace is made ahead (the kernel takes ~5 ms to make one), so a box's start takes it
ready. All the box's programs share the namespace, as a container's do. Nothing outlives the
box: the namespace is held only by this process's descriptor, that thread and the box's
processes, and :meth:`BoxNetns.close` closes listeners and descriptor and ends the thread.
Needs ``CAP_SYS_ADMIN`` (root); :meth:`BoxNetns.make` returns None elsewhere and the box keeps
the forwarder per run.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import functools
import os
import queue
import shutil
import socket
import struct
import threading
from collections.abc import Awaitable, Callable, Collection
from concurrent.futures import Future

CLONE_NEWNET = 0x40000000
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _run_in_thread(work: Callable[[], object]) -> object:
    """``work`` in a thread of its own: a thread in another namespace never serves anyone else."""
    result: list[object] = []
    error: list[BaseException] = []

    def main() -> None:
        try:
            result.append(work())
        except BaseException as exc:
            error.append(exc)

    thread = threading.Thread(target=main, name="vfray-box-netns", daemon=True)
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]


def _check(rc: int, what: str) -> None:
    if rc != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _new_netns() -> int:
    """A descriptor of a new namespace with its loopback up (in a throwaway thread: it goes
    there and back)."""
    libc = _libc()
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        _check(libc.unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")
        try:
            fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                ifreq = struct.pack("16sH22x", b"lo", 0)
                flags = struct.unpack("16sH22x", fcntl.ioctl(s.fileno(), _SIOCGIFFLAGS, ifreq))[1]
                fcntl.ioctl(
                    s.fileno(), _SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | _IFF_UP)
                )
            return fd
        finally:
            # Back home even though the thread ends: nothing else may run in the box's.
            _check(libc.setns(home, CLONE_NEWNET), "setns back")
    finally:
        os.close(home)


# One namespace made ahead, off any box's start: the kernel takes ~5 ms to make one (all its
# per-namespace state), which was most of a box's start. It is only a descriptor of this
# process (gone with it); a box takes it and a thread makes the next.
_spares: list[int] = []
_spare_lock = threading.Lock()
_refilling = False


def _take() -> int:
    with _spare_lock:
        fd = _spares.pop() if _spares else -1
    if fd < 0:
        made = _run_in_thread(_new_netns)
        assert isinstance(made, int)
        fd = made
    _refill()
    return fd


def _refill() -> None:
    global _refilling
    with _spare_lock:
        if _refilling or _spares:
            return
        _refilling = True

    def make_one() -> None:
        global _refilling
        try:
            fd = _new_netns()
            with _spare_lock:
                _spares.append(fd)
        except OSError:
            pass
        finally:
            with _spare_lock:
                _refilling = False

    threading.Thread(target=make_one, name="vfray-netns-spare", daemon=True).start()


def spare_fds() -> list[int]:
    """The descriptors of the namespaces made ahead (none held by a box)."""
    with _spare_lock:
        return list(_spares)


def _listener(port: int) -> socket.socket:
    """A listening TCP socket on ``127.0.0.1:port`` of the calling thread's namespace."""
    # IPPROTO_TCP (not 0) so asyncio sets TCP_NODELAY on the connections.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(256)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


class _Binder:
    """A thread that enters one box's namespace for good and makes its listening sockets
    there on request, so a listener costs a hand-over (~0.04 ms of CPU) instead of a new
    thread and two ``setns`` (~0.23 ms). It serves that namespace only, and ends with
    :meth:`stop` (or with the process: a daemon thread)."""

    def __init__(self, fd: int) -> None:
        self._queue: queue.SimpleQueue[
            tuple[Callable[[], socket.socket], Future[socket.socket]] | None
        ] = queue.SimpleQueue()
        entered: Future[None] = Future()
        threading.Thread(
            target=self._main, args=(fd, entered), name="vfray-box-netns-bind", daemon=True
        ).start()
        entered.result()  # an OSError when the thread could not enter the namespace

    def _main(self, fd: int, entered: Future[None]) -> None:
        try:
            _check(_libc().setns(fd, CLONE_NEWNET), "setns into the box's namespace")
        except OSError as exc:
            entered.set_exception(exc)
            return
        entered.set_result(None)
        while (item := self._queue.get()) is not None:
            work, done = item
            try:
                done.set_result(work())
            except BaseException as exc:
                done.set_exception(exc)

    def call(self, work: Callable[[], socket.socket]) -> socket.socket:
        done: Future[socket.socket] = Future()
        self._queue.put((work, done))
        return done.result()

    def stop(self) -> None:
        self._queue.put(None)


class BoxNetns:
    """One box's network namespace: a descriptor that holds it and listeners inside it."""

    def __init__(self, fd: int, nsenter: str) -> None:
        self.fd = fd
        self.nsenter = nsenter
        self._servers: dict[int, asyncio.AbstractServer] = {}
        self._binder: _Binder | None = None

    @classmethod
    def make(cls) -> BoxNetns | None:
        """A new namespace with its loopback up, or None where this process may not make one
        (not root, a seccomp profile, no ``nsenter``)."""
        nsenter = shutil.which("nsenter")
        if nsenter is None or os.geteuid() != 0:
            return None
        try:
            return cls(_take(), nsenter)
        except OSError:
            return None

    def enter_argv(self) -> list[str]:
        """An argv prefix that runs the rest in this namespace (``bwrap --share-net`` then keeps
        it); the descriptor is read through this process's ``/proc`` entry."""
        return [self.nsenter, f"--net=/proc/{os.getpid()}/fd/{self.fd}", "--"]

    def listening(self) -> set[int]:
        return set(self._servers)

    async def listen(
        self,
        port: int,
        handler: Handler,
        protocol: Callable[[], asyncio.Protocol] | None = None,
    ) -> None:
        """Serve box port ``port`` (on the namespace's 127.0.0.1) with ``handler``, or with
        ``protocol``'s protocols when given (a server of this loop takes the connections)."""
        kept = self._servers.get(port)
        if kept is not None:
            if kept.get_loop() is asyncio.get_running_loop():
                return
            # A warm box's listener, kept from a rollout on another loop (a closed one: each
            # asyncio.run has its own): made again on this one.
            with contextlib.suppress(RuntimeError):
                kept.close()
            del self._servers[port]
        if self._binder is None:
            self._binder = _Binder(self.fd)
        sock = self._binder.call(functools.partial(_listener, port))
        if protocol is not None:
            loop = asyncio.get_running_loop()
            self._servers[port] = await loop.create_server(protocol, sock=sock)
        else:
            self._servers[port] = await asyncio.start_server(handler, sock=sock)

    def stop_listening(self, keep: Collection[int] = ()) -> None:
        """Close every listener but those on the ports ``keep``; the namespace and its binding
        thread are kept (for the box's next rollout)."""
        for port in [port for port in self._servers if port not in keep]:
            with contextlib.suppress(RuntimeError):  # a listener of a closed loop
                self._servers.pop(port).close()

    def release(self) -> None:
        """Listeners, binding thread and descriptor let go: nothing of this process holds the
        namespace any more."""
        self.stop_listening()
        if self._binder is not None:
            self._binder.stop()
            self._binder = None
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1

    async def close(self) -> None:
        self.release()
