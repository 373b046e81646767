"""Shared pytest fixtures: one local Ray per test session (each ``ray.init`` costs seconds
here), started the way vfray starts one (loopback only, token auth on), and a fixture for
tests that need no Ray running."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

# Ray reads this once, at import: it keeps the Rays that tests start by other means than
# actors.cluster.connect (ray.cluster_utils.Cluster) on loopback too.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

_SHARED = {"started": False}


def start_local_ray() -> None:
    import ray

    from actors import _local_ray

    if ray.is_initialized():
        return
    # What actors.cluster.connect() does with no address, minus its reading of RAY_ADDRESS:
    # the suite never joins another Ray running on this machine.
    _local_ray.start(num_cpus=4)
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

    from actors import _local_ray

    if ray.is_initialized():
        ray.shutdown()
    # The shared Ray's auth settings stay cached in this process; the test's cluster has its own.
    _local_ray.restore_auth_settings()
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
