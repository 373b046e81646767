"""Process helpers shared by the local runtimes (subprocess, bwrap, docker's host side): the
scrubbed box environment, process-group runs with capped output and timeouts, rlimits, kills."""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import os
import resource
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from vfray.errors import SandboxError
from vfray.runtimes._spawn import PopenProcess, create_subprocess_exec
from vfray.runtimes.base import ProgramResult
from vfray.runtimes.launches import Launch
from vfray.runtimes.lifeline import OWNER_ENV
from vfray.runtimes.live import LocalProcess, wait_exit

OUTPUT_CAP = 64 * 1024
"""Bytes of stdout and of stderr kept per run (the tail: the end of a log says why it ended)."""

MARKER_ENV = "VFRAY_BOX_ID"
"""Set in every boxed process so ``stop`` can find strays that left the process group."""

SECRET_PATTERNS = (
    "*API_KEY*",
    "*APIKEY*",
    "*TOKEN*",
    "*SECRET*",
    "*PASSWORD*",
    "*PASSWD*",
    "*CREDENTIAL*",
    "*PRIVATE_KEY*",
    "*SESSION_KEY*",
    "*AUTH*",
    "AWS_*",
    "AZURE_*",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "GCP_*",
    "HF_*",
    "HUGGING_FACE_*",
    "WANDB_*",
    "RAY_*",
    "SSH_AUTH_SOCK",
    "MODAL_*",
    "DOCKER_*",
)
KEPT_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TERM", "TZ")
"""The only host variables a box inherits (after the secret filter); all else is dropped."""

LIVE_LINE_LIMIT = 16 * 1024 * 1024
"""Longest line ``readline`` returns from a live process's output (one JSON-RPC message of an
ACP agent can carry a whole file)."""

_GRACE_AFTER_EXIT = 0.5
"""Seconds to keep reading output after the main process exits; a daemon it left behind may
hold the pipe open forever, and must not make ``run`` hang."""


def is_secret(name: str) -> bool:
    """Whether an environment variable name looks like a credential."""
    upper = name.upper()
    return any(fnmatch.fnmatchcase(upper, pattern) for pattern in SECRET_PATTERNS)


_KEPT_SAFE = tuple(k for k in KEPT_ENV if not is_secret(k))


def box_env(
    base: Mapping[str, str],
    home: str,
    marker: str,
    extra: Mapping[str, str] | None = None,
    *,
    owner: str | None = None,
) -> dict[str, str]:
    """The environment of a boxed process: a few safe host variables, HOME, the box marker and
    the owner's (:mod:`vfray.runtimes.lifeline`), then ``extra`` (the caller's own variables,
    which may carry e.g. the rollout secret)."""
    # Looked up by name: iterating os.environ decodes every variable of the owner's (~35 µs a
    # launch on the subprocess runtime, whose base it is).
    env = {k: base[k] for k in _KEPT_SAFE if k in base}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.setdefault("LANG", "C.UTF-8")
    env["HOME"] = home
    env[MARKER_ENV] = marker
    if owner is not None:
        env[OWNER_ENV] = owner
    env.update(extra or {})
    return env


PROXY_ENV = tuple(
    name
    for proxy in ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY")
    for name in (proxy, proxy.lower())
)
CA_BUNDLES = (
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
)


def network_env(base: Mapping[str, str], *, host_paths: bool = True) -> dict[str, str]:
    """Variables a box that is allowed the network gets from the host: its proxies, and (where
    the box sees the host's files, ``host_paths``) its TLS roots as ``SSL_CERT_FILE`` /
    ``SSL_CERT_DIR``, also named for Node (``NODE_EXTRA_CA_CERTS``) and requests."""
    env = {name: base[name] for name in PROXY_ENV if base.get(name)}
    if not host_paths:
        return env
    bundle = base.get("SSL_CERT_FILE") or next(
        (path for path in CA_BUNDLES if os.path.isfile(path)), None
    )
    if bundle:
        env.update(SSL_CERT_FILE=bundle, NODE_EXTRA_CA_CERTS=bundle, REQUESTS_CA_BUNDLE=bundle)
    if base.get("SSL_CERT_DIR"):
        env["SSL_CERT_DIR"] = base["SSL_CERT_DIR"]
    return env


def kill_pids(pids: Sequence[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


class _TailBuffer:
    """Keeps the last ``cap`` bytes of a stream and whether anything was dropped."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.data = bytearray()
        self.truncated = False

    def add(self, chunk: bytes) -> None:
        self.data += chunk
        if len(self.data) > self.cap:
            del self.data[: len(self.data) - self.cap]
            self.truncated = True

    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")


async def _drain(stream: asyncio.StreamReader | None, sink: _TailBuffer) -> None:
    if stream is None:
        return
    while chunk := await stream.read(65536):
        sink.add(chunk)


async def run_process_group(
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: str,
    *,
    timeout: float | None,
    stdin: bytes | None,
    preexec_fn: Callable[[], None] | None,
    on_start: Callable[[int], None],
    output_cap: int = OUTPUT_CAP,
    launch: Launch | None = None,
) -> ProgramResult:
    """Run ``argv`` as the leader of a new session, capture the output tails, and SIGKILL the
    whole group on timeout. ``on_start(pgid)`` lets the runtime track the group for ``stop``;
    ``launch`` takes a slot of the launch throttle for the program's start-up."""
    launch = launch or Launch(None, signals_ready=False)
    started = time.monotonic()
    try:
        await launch.acquire()
        started = time.monotonic()  # the wait for a launch slot is not the program's time
        proc = await create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=cwd,
            env=launch.child_env(dict(env)),
            start_new_session=True,
            preexec_fn=preexec_fn,
            pass_fds=(launch.write_fd,) if launch.write_fd >= 0 else (),
        )
    except (FileNotFoundError, PermissionError) as exc:
        launch.release()
        if exc.filename == cwd:
            # The box's work dir is gone (stopped under the run): the box failed, not the
            # program; reported as the program's exit 127 it read "No such file" for argv[0].
            raise SandboxError(f"cannot start {argv[0]!r}: work dir {cwd} is gone") from exc
        # Report a missing or non-executable program as a shell would, like the other boxes.
        return ProgramResult(
            exit_code=127 if isinstance(exc, FileNotFoundError) else 126,
            stderr=f"{argv[0]}: {exc.strerror}\n",
            duration=time.monotonic() - started,
        )
    except (OSError, ValueError) as exc:
        launch.release()
        raise SandboxError(f"cannot start {argv[0]!r}: {exc}") from exc
    except BaseException:
        launch.release()
        raise
    launch.spawned()
    on_start(proc.pid)
    out, err = _TailBuffer(output_cap), _TailBuffer(output_cap)
    readers = [
        asyncio.ensure_future(_drain(proc.stdout, out)),
        asyncio.ensure_future(_drain(proc.stderr, err)),
    ]
    timed_out = False
    try:
        if stdin is not None and proc.stdin is not None:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                proc.stdin.write(stdin)
                await proc.stdin.drain()
            proc.stdin.close()
        try:
            await asyncio.wait_for(wait_exit(proc), timeout)
        except TimeoutError:
            timed_out = True
            kill_group(proc.pid)
            await proc.wait()
        await asyncio.wait(readers, timeout=_GRACE_AFTER_EXIT)
    finally:
        launch.release()
        if proc.returncode is None:  # cancelled: never leave the group running
            kill_group(proc.pid)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        for reader in readers:
            reader.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
        if isinstance(proc, PopenProcess):
            proc.close_pipes()
    code = proc.returncode if proc.returncode is not None else -signal.SIGKILL
    return ProgramResult(
        exit_code=code,
        stdout=out.text(),
        stderr=err.text(),
        duration=time.monotonic() - started,
        timed_out=timed_out,
        truncated=out.truncated or err.truncated,
    )


async def start_live(
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: str,
    *,
    preexec_fn: Callable[[], None] | None,
    spare: frozenset[str] = frozenset(),
) -> LocalProcess:
    """Start ``argv`` as the leader of a new session with its three standard streams piped
    (``Runtime.open_process`` of the local runtimes). Raises :class:`SandboxError` when the
    program cannot be started. ``spare``: see :func:`vfray.runtimes.live.signal_tree`."""
    try:
        proc = await create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=cwd,
            env=env,
            start_new_session=True,
            preexec_fn=preexec_fn,
            limit=LIVE_LINE_LIMIT,
        )
    except (OSError, ValueError) as exc:
        raise SandboxError(f"cannot start {argv[0]!r}: {exc}") from exc
    return LocalProcess(proc, spare)


def rlimit_setter(
    memory_gb: float | None, cpu_seconds: int | None, pids: int | None
) -> Callable[[], None] | None:
    """A ``preexec_fn`` applying address-space, CPU-time and process-count limits, or None
    when there is nothing to limit (a ``preexec_fn`` forces a full fork instead of vfork).

    RLIMIT_NPROC counts every process of the *user*, not of the box, and the kernel ignores it
    for root; so it is set only for non-root users, as "processes now + ``pids``", which bounds
    a fork bomb without breaking the farm's own processes.
    """
    nproc = None
    if pids is not None and os.geteuid() != 0:
        uid = os.geteuid()
        mine = sum(1 for p in Path("/proc").iterdir() if p.name.isdigit() and _owner(p) == uid)
        nproc = mine + pids
    if memory_gb is None and cpu_seconds is None and nproc is None:
        return None

    def apply() -> None:
        if memory_gb is not None:
            limit = int(memory_gb * 1024**3)
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        if cpu_seconds is not None:
            resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 5))
        if nproc is not None:
            resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))

    return apply


def _owner(path: Path) -> int:
    try:
        return path.stat().st_uid
    except OSError:
        return -1
