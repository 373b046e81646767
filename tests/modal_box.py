"""A stand-in for the Modal service (its cloud is unreachable here), for the modal runtime's
offline tests: ``modal.Sandbox.create`` answers a sandbox whose ``exec`` runs the program as a
local process and whose ``filesystem`` is this host's. The images, and every call vfray makes,
are the installed SDK's own: ``Image`` is the real ``modal.Image`` (so the layers vfray builds
are the SDK's builders' output), and each call is bound to the real method's signature before
it is answered, so a renamed or dropped parameter fails here. What it cannot show: Modal's own
process model, network and image builds.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

BOX_PATH = "/usr/local/bin:/usr/bin:/bin"
"""A box's ``PATH`` (the image's), before a harness's own."""


def sdk() -> Any:
    return pytest.importorskip("modal")


class _Method:
    """An SDK method as vfray calls it (``obj.method.aio(...)``): bound to the real one's
    signature, then answered by ``fn``."""

    def __init__(self, real: Callable[..., Any], fn: Callable[..., Any], bound: bool = True):
        self._signature = inspect.signature(real)
        self._fn = fn
        self._bound = bound
        self.calls: list[inspect.BoundArguments] = []

    def _check(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.calls.append(self._signature.bind(*((None,) if self._bound else ()), *args, **kwargs))

    async def aio(self, *args: Any, **kwargs: Any) -> Any:
        self._check(args, kwargs)
        return await self._fn(*args, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self._check(args, kwargs)
        return self._fn(*args, **kwargs)


class _Reader:
    """A process's stdout/stderr: ``read.aio()`` (all of it) and ``async for`` (chunks), text
    or bytes as the exec asked."""

    def __init__(self, stream: asyncio.StreamReader, text: bool) -> None:
        reader = sdk().io_streams.StreamReader
        self._stream, self._text = stream, text
        self.read = _Method(reader.read, self._read_all)

    def _out(self, data: bytes) -> Any:
        return data.decode("utf-8", errors="replace") if self._text else data

    async def _read_all(self) -> Any:
        return self._out(await self._stream.read())

    async def __aiter__(self) -> AsyncIterator[Any]:
        while chunk := await self._stream.read(65536):
            yield self._out(chunk)


class _Writer:
    """A process's stdin: ``write`` (buffered), ``write_eof``, ``drain.aio()``."""

    def __init__(self, stream: asyncio.StreamWriter) -> None:
        writer = sdk().io_streams.StreamWriter
        self._stream = stream
        self._eof = False
        self.write = _Method(writer.write, self._write)
        self.write_eof = _Method(writer.write_eof, self._write_eof)
        self.drain = _Method(writer.drain, self._drain)

    def _write(self, data: bytes | str) -> None:
        self._stream.write(data.encode() if isinstance(data, str) else data)

    def _write_eof(self) -> None:
        self._eof = True

    async def _drain(self) -> None:
        with contextlib.suppress(ConnectionError):
            await self._stream.drain()
            if self._eof and not self._stream.is_closing():
                self._stream.close()


class LocalProcess:
    """One ``exec``: a local process in its own session (as a container's exec is its own)."""

    def __init__(self, process: asyncio.subprocess.Process, text: bool, timeout: int | None):
        container = sdk().container_process.ContainerProcess
        assert process.stdin and process.stdout and process.stderr
        self._process = process
        self.stdin = _Writer(process.stdin)
        self.stdout = _Reader(process.stdout, text)
        self.stderr = _Reader(process.stderr, text)
        self.wait = _Method(container.wait, self._wait)
        self._deadline = timeout

    async def _wait(self) -> int:
        try:
            async with asyncio.timeout(self._deadline):
                return await self._process.wait()
        except TimeoutError:  # Modal kills an exec past its timeout
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, signal.SIGKILL)
            return await self._process.wait()

    @property
    def returncode(self) -> int | None:
        return self._process.returncode

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._process.pid, signal.SIGKILL)

    async def close(self) -> None:
        """Reap it and close its pipes while the loop runs (not at garbage collection)."""
        await self._process.wait()
        transport = getattr(self._process, "_transport", None)
        if transport is not None:
            transport.close()


class LocalSandbox:
    """A sandbox on this host: ``exec``, ``filesystem``, ``poll``, ``terminate``."""

    def __init__(self, home: Path) -> None:
        modal = sdk()
        self.home = home
        self.processes: list[LocalProcess] = []
        self.terminated = False
        self.exec = _Method(modal.Sandbox.exec, self._exec)
        self.poll = _Method(modal.Sandbox.poll, self._poll)
        self.terminate = _Method(modal.Sandbox.terminate, self._terminate)
        files = modal.sandbox.sandbox.SandboxFilesystem
        self.filesystem = SimpleNamespace(
            read_bytes=_Method(files.read_bytes, self._read_bytes),
            write_bytes=_Method(files.write_bytes, self._write_bytes),
        )

    async def _exec(
        self,
        *args: str,
        timeout: int | None = None,
        workdir: str | None = None,
        env: dict[str, str | None] | None = None,
        text: bool = True,
        **_: Any,
    ) -> LocalProcess:
        variables = {"PATH": BOX_PATH, "HOME": str(self.home)}
        variables.update({k: v for k, v in (env or {}).items() if v is not None})
        process = await asyncio.create_subprocess_exec(
            *args,
            cwd=workdir,
            env=variables,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
            limit=1 << 24,
        )
        made = LocalProcess(process, text, timeout)
        self.processes.append(made)
        return made

    async def _poll(self) -> int | None:
        return 0 if self.terminated else None

    async def _terminate(self) -> None:
        self.terminated = True
        for process in self.processes:
            process.kill()
            await process.close()

    async def _read_bytes(self, remote_path: str) -> bytes:
        return Path(remote_path).read_bytes()

    async def _write_bytes(self, data: bytes, remote_path: str) -> None:
        Path(remote_path).parent.mkdir(parents=True, exist_ok=True)
        Path(remote_path).write_bytes(data)


class LocalModal:
    """What ``vfray.runtimes.modal`` imports as ``modal``: the real ``Image``, an ``App.lookup``
    and a ``Sandbox.create`` that answer without the service. ``created`` keeps each create's
    arguments (bound to the SDK's signature) and its sandbox."""

    def __init__(self, home: Path) -> None:
        modal = sdk()
        self.Image = modal.Image
        self.home = home
        self.created: list[tuple[inspect.BoundArguments, LocalSandbox]] = []
        self.App = SimpleNamespace(lookup=_Method(modal.App.lookup, self._lookup, bound=False))
        self.Sandbox = SimpleNamespace(
            create=_Method(modal.Sandbox.create, self._create, bound=False)
        )

    async def _lookup(self, name: str, **_: Any) -> Any:
        return SimpleNamespace(name=name)

    async def _create(self, *args: Any, **kwargs: Any) -> LocalSandbox:
        bound = inspect.signature(sdk().Sandbox.create).bind(*args, **kwargs)
        # The sandbox starts in its work dir, as a container starts in its image's WORKDIR.
        if kwargs.get("workdir"):
            Path(kwargs["workdir"]).mkdir(parents=True, exist_ok=True)
        box = LocalSandbox(self.home)
        self.created.append((bound, box))
        return box


def image_layers(image: Any) -> list[list[str]]:
    """The Dockerfile commands of each layer of a ``modal.Image``, base first, as the installed
    SDK's own builders give them to Modal's image builder (read from each lazy layer's
    ``dockerfile_function``, at the newest stable builder version the SDK knows)."""
    import typing

    from modal._image import ImageBuilderVersion
    from modal._utils.async_utils import synchronizer

    version = [v for v in typing.get_args(ImageBuilderVersion) if v != "PREVIEW"][-1]
    layers = []
    layer = synchronizer._translate_in(image)
    while layer is not None:
        scope = inspect.getclosurevars(layer._load).nonlocals
        build = scope.get("dockerfile_function")
        layers.append(list(build(version).commands) if build else [])
        layer = (scope.get("base_images") or {}).get("base")
    return layers[::-1]
