"""Shared pytest fixtures: one local Ray per test session (each ``ray.init`` costs seconds
here), kept on loopback, and a helper that lists processes carrying a sandbox marker."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

# Keep every Ray this suite starts on loopback, with token auth explicitly off (Ray 2.60 turns
# it on by default, which breaks a local single-user cluster's CLI calls).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

_SHARED = {"started": False}


def start_local_ray() -> None:
    import ray

    if ray.is_initialized():
        return
    ray.init(
        # "local": never join another Ray that happens to run on this machine.
        address="local",
        num_cpus=4,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
        configure_logging=False,
    )
    _SHARED["started"] = True


@pytest.fixture
def ray_local() -> Iterator[None]:
    """A local Ray shared by every test that asks for it (started on first use)."""
    start_local_ray()
    yield


@pytest.fixture
def ray_fresh() -> Iterator[None]:
    """No Ray running: the test starts (and must shut down) its own, e.g. a multi-node
    ``ray.cluster_utils.Cluster``. The shared one is restarted lazily afterwards."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    yield
    if ray.is_initialized():
        ray.shutdown()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    try:
        import ray
    except ImportError:
        return
    if ray.is_initialized():
        ray.shutdown()
