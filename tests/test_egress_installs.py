"""Setup with network, then the agent without (issue 28 item 3), with the real installers: an
image task's setup ``apt-get install``s a Debian package and ``npm install``s an npm one through
the node's egress proxy, on docker, podman and bwrap over the offline Debian base image; its
agent phase (scoring runs under the agent's policy) is refused the same hosts.

These reach the real Debian mirror (http, plain proxy requests) and npm registry (https, through
``CONNECT``), the only outside hosts a test may reach; skipped where their names do not resolve.
npm is the node's own, mounted into the box read-only, run by the node's ``node``."""

from __future__ import annotations

import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

import vfray as vf
from vfray.runtimes.base import Runtime

MIRROR, REGISTRY = "deb.debian.org", "registry.npmjs.org"
NPM_HOME = "/usr/lib/node_modules/npm"


def _resolves(host: str) -> bool:
    try:
        socket.getaddrinfo(host, 443, type=socket.SOCK_STREAM)
    except OSError:
        return False
    return True


@pytest.fixture(scope="module")
def npm_dir() -> Iterator[str]:
    """A copy of the node's npm outside ``/usr`` (a bwrap box over an image mounts node paths
    at their own place, and ``/usr`` is the image's)."""
    if shutil.which("node") is None or not Path(NPM_HOME, "bin", "npm-cli.js").is_file():
        pytest.skip(f"needs node and npm at {NPM_HOME}")
    if not (_resolves(MIRROR) and _resolves(REGISTRY)):
        pytest.skip(f"{MIRROR} or {REGISTRY} does not resolve here")
    where = Path(tempfile.mkdtemp(prefix="vfray-npm-"))
    shutil.copytree(NPM_HOME, where / "npm", symlinks=True)
    where.chmod(0o755)
    yield str(where / "npm")
    shutil.rmtree(where, ignore_errors=True)


def _apt(package: str, *, update: bool) -> list[str]:
    install = f"apt-get install -y -q --no-install-recommends {package}"
    # No translations: an update fetches 9.4 MB instead of 15.8 (measured here).
    first = "apt-get update -q -o Acquire::Languages=none && " if update else ""
    return ["sh", "-c", first + install]


class Installs(vf.Task[vf.TaskData]):
    """Setup installs ``tree`` with apt and ``is-number`` with npm; the reward is 1 when both
    are there and, under the agent's policy, the same installers are refused."""

    npm: ClassVar[str] = ""
    said: ClassVar[list[str]] = []

    def _npm(self, package: str, prefix: str) -> list[str]:
        return [f"{self.npm}/bin/npm-cli.js", "install", "--prefix", prefix, "--no-audit",
                "--no-fund", "--fetch-retries=0", "--cache", "/tmp/npm-cache", package]  # fmt: skip

    async def setup(self, trace: vf.Trace, runtime: Runtime) -> None:
        apt = await runtime.run(_apt("tree", update=True), timeout=600)
        npm = await runtime.run(self._npm("is-number@7.0.0", "/tmp/setup-npm"), timeout=300)
        for what, done in (("apt", apt), ("npm", npm)):
            if not done.ok:
                raise RuntimeError(f"setup's {what} failed: {(done.stdout + done.stderr)[-1500:]}")

    @vf.reward
    async def offline_after_setup(self, trace: vf.Trace, runtime: Runtime) -> float:
        tree = await runtime.run(["tree", "--version"], timeout=60)
        kept = await runtime.read("/tmp/setup-npm/node_modules/is-number/package.json")
        apt = await runtime.run(_apt("jq", update=False), timeout=300)
        npm = await runtime.run(self._npm("is-odd@3.0.1", "/tmp/agent-npm"), timeout=300)
        refused = list(getattr(runtime, "egress").refused)  # noqa: B009 - every runtime here
        self.said.extend([tree.stdout, apt.stdout + apt.stderr, npm.stdout + npm.stderr])
        self.said.extend(refused)
        return float(
            tree.ok
            and b'"version": "7.0.0"' in kept
            and not apt.ok
            and not npm.ok
            and any(MIRROR in why for why in refused)
            and any(REGISTRY in why for why in refused)
        )


@pytest.fixture(params=["bwrap", "docker", "podman"])
def box(request: pytest.FixtureRequest, npm_dir: str) -> tuple[str, str, dict[str, Any]]:
    """(runtime, the task's image, runtime options) for each runtime, with npm mounted."""
    from vfray.runtimes.debian_image import DebianImage

    runtime = str(request.param)
    if runtime == "bwrap" and shutil.which("bwrap") is None:
        pytest.skip("needs bubblewrap")
    image = request.getfixturevalue("debian_image")
    assert isinstance(image, DebianImage)
    node = shutil.which("node")
    assert node is not None
    volumes = {npm_dir: npm_dir, node: "/usr/local/bin/node"}
    if runtime == "bwrap":
        return runtime, image.oci, {"ro_binds": [str(Path(npm_dir).parent)]}
    if runtime == "docker":
        docker_url = request.getfixturevalue("docker_url")
        name = request.getfixturevalue("debian_in_docker")
        return runtime, name, {"base_url": docker_url, "volumes": volumes}
    from vfray.runtimes.podman import PodmanRuntime

    if shutil.which("podman") is None:
        pytest.skip("podman is not installed (apt-get install podman)")
    try:
        PodmanRuntime.preflight({})
    except vf.ConfigError as exc:
        pytest.skip(str(exc))
    return runtime, image.oci, {"volumes": volumes}


@pytest.mark.slow  # 10-35 s a runtime: apt-get update fetches ~9 MB of lists
@pytest.mark.docker
@pytest.mark.bwrap
async def test_setup_installs_with_apt_and_npm_and_the_agent_phase_cannot(
    box: tuple[str, str, dict[str, Any]], npm_dir: str
) -> None:
    runtime, image, options = box
    Installs.npm = npm_dir
    Installs.said.clear()
    trace = await vf.run_rollout(
        Installs(vf.TaskData(prompt="hi", image=image)),
        model="scripted:echo",
        harness="null",
        runtime=runtime,
        runtime_options=options,
    )
    assert not trace.errors, trace.errors
    assert trace.reward == 1.0, Installs.said
