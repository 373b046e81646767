"""A local Ray whose raylet misses Ray's hard-coded 30 s registration wait (seen on a loaded
2-core CI machine) is started again: the first attempt's processes are found by its token and
killed, the second attempt comes up on loopback. Any other start error is raised at once.

Ray's timeout itself cannot be provoked on demand, so the first attempt stands in for it: it
starts a real process carrying the attempt's token (as Ray's half-started GCS and raylet do) and
raises Ray's exception text; the second attempt is the real start."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest
import ray

from actors import _local_ray

RAY_TIMEOUT = (
    "The current node timed out during startup. This could happen because some of the raylet "
    "failed to startup or the GCS has become overloaded."
)


@pytest.fixture
def leftover() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        proc.kill()
        proc.wait()


def test_a_start_that_timed_out_is_killed_and_started_again(
    ray_fresh: None, monkeypatch: pytest.MonkeyPatch, leftover: list[subprocess.Popen[bytes]]
) -> None:
    real_init = _local_ray._init
    tokens: list[str] = []

    def timing_out_once(num_cpus: int | None, token: str) -> None:
        tokens.append(token)
        if len(tokens) == 1:
            env = {**os.environ, "RAY_AUTH_TOKEN": token}
            leftover.append(subprocess.Popen(["sleep", "120"], env=env))
            raise Exception(RAY_TIMEOUT)
        real_init(num_cpus, token)

    monkeypatch.setattr(_local_ray, "_init", timing_out_once)
    _local_ray.start(num_cpus=1)
    assert ray.is_initialized()
    assert ray.util.get_node_ip_address() == _local_ray.LOOPBACK
    assert len(tokens) == 2 and tokens[0] != tokens[1]
    # The first attempt's process was killed (SIGKILL), not left to the owner's exit.
    assert leftover[0].wait(timeout=10) == -9
    assert _local_ray._pids_with_token(tokens[0]) == []
    assert _local_ray._pids_with_token(tokens[1]), "the running Ray carries its own token"


def test_any_other_start_error_is_raised_at_once(
    ray_fresh: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []

    def failing(num_cpus: int | None, token: str) -> None:
        calls.append(token)
        raise RuntimeError("port already in use")

    monkeypatch.setattr(_local_ray, "_init", failing)
    with pytest.raises(RuntimeError, match="port already in use"):
        _local_ray.start(num_cpus=1)
    assert len(calls) == 1


def test_the_last_attempt_s_timeout_is_raised(
    ray_fresh: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []

    def always_timing_out(num_cpus: int | None, token: str) -> None:
        calls.append(token)
        raise Exception(RAY_TIMEOUT)

    monkeypatch.setattr(_local_ray, "_init", always_timing_out)
    with pytest.raises(Exception, match="timed out during startup"):
        _local_ray.start(num_cpus=1)
    assert len(calls) == _local_ray.START_ATTEMPTS
