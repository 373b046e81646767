"""Start a private local Ray that listens on loopback only, with token auth on and a token of
its own; and undo this process's auth settings before joining some other cluster.

Everything here leans on Ray 2.60 internals (named where used), kept in one place so an upgrade
has one file to re-check; ``tests/test_ray_security.py`` fails if a listener leaves loopback.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import sys
import time
from collections.abc import Iterator
from typing import Any

import ray

from vfray.runtimes.lifeline import OWNER_ENV, owner_id
from vfray.runtimes.processes import kill_pids
from vfray.runtimes.strays import pids_by_env

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
START_ATTEMPTS = 3
# How long a node start waits for its raylet to register with the GCS (Ray's own wait: 30 s).
RAYLET_REGISTER_WAIT_S = 120.0
_STARTUP_TIMEOUT = "timed out during startup"

# Whether this process's cached Ray auth settings are a local start's (see restore_auth_settings).
_state = {"auth_overridden": False}


@contextlib.contextmanager
def _environment(values: dict[str, str | None]) -> Iterator[None]:
    """Set (or, for None, remove) environment variables for the block, then restore them. Ray
    processes started inside the block inherit the values; this process keeps none of them."""
    saved = {name: os.environ.get(name) for name in values}
    try:
        for name, value in values.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        yield
    finally:
        for name, old in saved.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old


def _reload_auth_settings() -> None:
    """Make this process re-read RAY_AUTH_MODE and the token. Ray caches both on first use (the
    mode in its C++ RayConfig, the token in AuthenticationTokenLoader), so a changed
    environment is not seen otherwise; this is what ``ray.init`` itself does when it turns
    token auth on by default."""
    from ray._raylet import AuthenticationTokenLoader, Config  # type: ignore[attr-defined]

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


@contextlib.contextmanager
def _loopback_node_address() -> Iterator[None]:
    """Let ``ray.init(_node_ip_address="127.0.0.1")`` keep 127.0.0.1.

    ``ray.init`` rewrites a loopback node address to the machine's outward address unless
    ``ray._private.ray_constants.ENABLE_RAY_CLUSTER`` is false, and that constant is read from
    ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` only when Ray is first imported — setting the variable
    later changes nothing. With a loopback node address every Ray server binds 127.0.0.1 (the
    C++ gRPC servers, the dashboard agent, the runtime-env agent, metrics); with the outward
    address GCS, raylet and workers listen on all interfaces.
    """
    from ray._private import ray_constants

    before = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        # The variable too, so the Ray processes started now read it at their own import.
        with _environment({"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}):
            yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = before


@contextlib.contextmanager
def patient_node_start(wait_s: float = RAYLET_REGISTER_WAIT_S) -> Iterator[None]:
    """Within the block, a Ray node being started waits up to ``wait_s`` for its raylet to
    register with the GCS, instead of Ray's hard-coded 30 s.

    ``ray._private.node.Node`` polls ``ray._private.services.get_node`` (looked up at each
    call) until the raylet has registered, and gives up after 30 s. On a loaded 2-core machine
    (CI; load average ~20 with other work running) the raylet registered later than that,
    because it waits for Ray's Python agents, which import slowly under load. Here that function
    keeps asking for ``wait_s`` itself before it lets Ray see the "not yet" error, so a slow
    start is waited for and a start that never registers still fails. Used for vfray's own
    local start and for the tests' ``ray.cluster_utils`` clusters.
    """
    from ray._private import services

    original = services.get_node

    def patient_get_node(gcs_address: str, node_id: str) -> Any:
        # Called from ray._private.node.Node.__init__: its `self` knows the node's processes.
        node = sys._getframe(1).f_locals.get("self")
        deadline = time.monotonic() + wait_s
        while True:
            try:
                return original(gcs_address, node_id)  # type: ignore[no-untyped-call]
            except RuntimeError:
                if _raylet_exited(node):
                    # Seen under load: the raylet aborts when Ray's dashboard agent is slow to
                    # write its port file. Waiting longer cannot help; fail now, in the words
                    # start() retries on.
                    raise Exception(  # Ray's own bare Exception type, on purpose
                        "The current node timed out during startup: its raylet exited"
                    ) from None
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    services.get_node = patient_get_node
    try:
        yield
    finally:
        services.get_node = original


def _raylet_exited(node: object) -> bool:
    dead = getattr(node, "dead_processes", None)
    if not callable(dead):
        return False
    from ray._private import ray_constants

    return any(kind == ray_constants.PROCESS_TYPE_RAYLET for kind, _ in dead())


def start(num_cpus: int | None) -> None:
    """Start a local Ray owned by this process, on loopback, with a fresh auth token.

    The token lives only in the environment of the Ray processes started here (inherited at
    their start) and in this process's memory: it is not written to ``~/.ray/auth_token`` (no
    file to leave world-readable, no race with other Rays of this user) and not left in this
    process's environment. Boxes do not inherit it (their environment is scrubbed), but a box
    that can read this user's other processes — the ``subprocess`` runtime isolates nothing —
    can find it. Raises RuntimeError if Ray came up anywhere but loopback.
    """
    for attempt in range(START_ATTEMPTS):
        token = secrets.token_hex(32)
        try:
            _init(num_cpus, token)
            break
        except Exception as exc:
            # Ray waits a hard-coded 30 s for its raylet to register with the GCS
            # (ray/_private/node.py) and raises a bare Exception past it; on a loaded 2-core
            # machine that wait was missed (CI). The half-started processes are not known to
            # ray.shutdown(): they are found by this attempt's token and killed, then a fresh
            # start is tried.
            if _STARTUP_TIMEOUT not in str(exc) or attempt == START_ATTEMPTS - 1:
                raise
            log.warning("the local Ray did not come up in time (%s); starting it again", exc)
            ray.shutdown()
            kill_start(token)
    node_ip = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
    if node_ip != LOOPBACK:
        ray.shutdown()
        raise RuntimeError(f"the local Ray came up on {node_ip}, not {LOOPBACK}; stopped it")


WORKER_SYSTEM_CONFIG: dict[str, Any] = {"worker_niceness": 0}
"""Ray starts its worker processes at nice 15, to keep its own daemons responsive. vfray's
workers are the workload: the SandboxHosts run the rollouts (and their boxes inherit the nice
value), the TraceSink writes and compacts the run. At nice 15 any nice-0 load on the machine
starves them: under two CPU-bound processes on 2 cores a sink's 25-part compaction took 9-16 s
of wall time for 0.6 s of CPU (0.23 s in a plain process), and a CI test ran past its timeout.
Also for the tests' ``cluster_utils`` clusters (``_system_config`` in their head node args). A
``RAY_worker_niceness`` in the environment is left to win."""


def worker_system_config() -> dict[str, Any]:
    """``_system_config`` for a Ray that vfray starts (see :data:`WORKER_SYSTEM_CONFIG`)."""
    return {} if "RAY_worker_niceness" in os.environ else dict(WORKER_SYSTEM_CONFIG)


def _init(num_cpus: int | None, token: str) -> None:
    token_env: dict[str, str | None] = {
        # The owner's lifeline (vfray.runtimes.lifeline) kills every process carrying this
        # process's token once it dies, SIGKILL included: Ray's own agents otherwise linger a
        # minute or more after their driver was killed, retrying a GCS that died with it.
        OWNER_ENV: owner_id(),
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": token,
        "RAY_AUTH_TOKEN_PATH": None,
    }
    with _loopback_node_address(), _environment(token_env), patient_node_start():
        _reload_auth_settings()
        _state["auth_overridden"] = True
        ray.init(
            # "local": start our own, never join some other Ray that happens to run here.
            address="local",
            num_cpus=num_cpus,
            include_dashboard=False,
            _node_ip_address=LOOPBACK,
            log_to_driver=False,
            configure_logging=False,
            _system_config=worker_system_config(),
        )


QUIET_SCANS = 2
"""How many scans in a row must find no process of a start before :func:`kill_start` is done."""
SCAN_PAUSE_S = 0.01
MAX_SCANS = 100


def kill_start(token: str) -> None:
    """SIGKILL every process of one start (found by its token), scanning /proc until
    :data:`QUIET_SCANS` scans in a row find none. One scan is not enough: a process that is
    mid-exec shows an empty environment for a moment (the kernel sets the new one up after it
    has closed the close-on-exec descriptors, which is when its parent's ``Popen`` returns) —
    measured here, 5 of 1,000 scans made right after ``Popen`` returned missed the process, and
    in CI that left a test's process alive."""
    quiet = 0
    for _ in range(MAX_SCANS):
        pids = _pids_with_token(token)
        kill_pids(pids)
        quiet = 0 if pids else quiet + 1
        if quiet >= QUIET_SCANS:
            return
        time.sleep(SCAN_PAUSE_S)
    log.warning("a timed-out Ray start's processes kept appearing: %s", pids)


def _pids_with_token(token: str) -> list[int]:
    """PIDs of the processes started with this auth token (one start's Ray processes)."""
    return pids_by_env("RAY_AUTH_TOKEN").get(token, [])


def restore_auth_settings() -> None:
    """Before joining an existing cluster: drop the auth settings a local start left cached
    in this process, so the cluster's own (RAY_AUTH_MODE, its token) apply."""
    if _state["auth_overridden"]:
        _reload_auth_settings()
        _state["auth_overridden"] = False
