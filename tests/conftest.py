"""Shared pytest fixtures: one local Ray per test session (each ``ray.init`` costs seconds
here), started the way vfray starts one (loopback only, token auth on), and a fixture for
tests that need no Ray running."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

# Task folders the tests run in boxes (Harbor tasks' own tests/, verifier scripts): data for the
# tests, never tests of this suite.
collect_ignore_glob = ["fixtures/*"]

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


@pytest.fixture(scope="session")
def docker_url() -> Iterator[str]:
    """A ``dockerd`` started by hand with the test image (tests/docker_engine.py), one per test
    session (per xdist worker); the tests that ask for it are skipped where it cannot run."""
    from docker_engine import docker_engine

    with docker_engine() as url:
        yield url


@pytest.fixture(scope="session")
def debian_image() -> object:
    """The offline Debian base image (vfray.runtimes.debian_image: mmdebstrap, then umoci),
    built once per machine into ``$VFRAY_CI_IMAGES`` (default /var/cache/vfray-ci/images) and
    kept between runs; skipped with the reason where it cannot be built."""
    from pathlib import Path

    from vfray.runtimes import debian_image as base

    missing = base.missing_tools()
    if missing or os.geteuid() != 0:
        pytest.skip(f"no base image: {', '.join(missing) or 'mmdebstrap as root'} needed")
    try:
        return base.build(Path(os.environ.get("VFRAY_CI_IMAGES", "/var/cache/vfray-ci/images")))
    except (OSError, RuntimeError) as exc:
        pytest.skip(f"no base image: {exc}")


@pytest.fixture(scope="session")
def debian_in_docker(debian_image: object, docker_url: str) -> str:
    """The base image imported into the session's dockerd as ``vfray-base:bookworm``, for
    task images built ``FROM`` it."""
    from vfray.runtimes import debian_image as base

    assert isinstance(debian_image, base.DebianImage)
    return base.import_into_docker(debian_image, docker_url)


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


# The files that take longest (measured: junit times of a full run, the files of 40 s or more),
# longest first. Under `-n 2 --dist loadfile` each worker takes the next file as it frees, so
# starting with the long ones leaves short files to fill the end instead of one long file
# running alone at the tail.
SLOWEST_FILES_FIRST = (
    "test_compat_v1_vs_verifiers.py",  # ~200 s: verifiers 0.4.0 and vfray on 3 tasksets
    "test_harbor_vs_harbor.py",  # ~250-400 s: Harbor 0.26.0 and vfray, 10 tasks, 2 agents
    "test_farm.py",
    "test_run_folder_recovery.py",
    "test_notebooks.py",
    "test_cli_first_hour.py",
    "test_agents.py",
    "test_runtime_env_wheel.py",
    "test_chaos.py",
    "test_tools_nodes.py",
    "test_ray_job.py",
    "test_interception_pool.py",
    "test_tunnels.py",
    "test_farm_shipping.py",
    "test_farm_failures.py",
    "test_acp_docker.py",
    "test_acp_retries.py",
    "test_tools_ray.py",
    "test_runtime_modal.py",
    "test_acp_modal.py",
    "test_agents_modal.py",
    "test_acp.py",
    "test_verifiers_program.py",
    "test_cli.py",
    "test_agent_retries.py",
    "test_ray_security.py",
    "test_users.py",
    "test_stream_stop.py",
    "test_readme.py",
)


def pytest_configure(config: pytest.Config) -> None:
    # xdist would otherwise reorder files by their number of tests (largest first).
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    rank = {name: i for i, name in enumerate(SLOWEST_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable within a file


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    try:
        import ray
    except ImportError:
        return
    if ray.is_initialized():
        ray.shutdown()
