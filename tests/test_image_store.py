"""The node's image store (vfray.runtimes.images) against the tests' own dockerd and real
skopeo/umoci: task images built FROM the offline Debian base, loaded from archives and layouts,
each once per node however many rollouts and processes ask; unpacked roots for bwrap; and bad
images refused in one line with nothing left behind. Never pulls from a registry: the one pull
goes to a closed port on 127.0.0.1."""

from __future__ import annotations

import asyncio
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from vfray.errors import SandboxError
from vfray.runtimes import _trust_policy
from vfray.runtimes._image_layers import can_untar
from vfray.runtimes.base import RuntimeSpec
from vfray.runtimes.docker import DockerRuntime
from vfray.runtimes.images import (
    CACHE_ENV,
    docker_image,
    has_shell,
    image_config,
    parse_image,
    rootfs,
)

REPO = Path(__file__).resolve().parents[1]
NO_REGISTRY = "127.0.0.1:9/nothing/here:1"
"""A registry reference whose registry is a closed local port: the pull fails at once."""
SKOPEO = ["skopeo", "--insecure-policy"]
"""The tests' own copies of their local layouts, on a node with or without a trust policy."""

pytestmark = pytest.mark.skipif(
    shutil.which("skopeo") is None or shutil.which("umoci") is None,
    reason="skopeo and umoci are needed (apt-get install skopeo umoci)",
)


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh image store for the test."""
    cache = tmp_path / "store"
    monkeypatch.setenv(CACHE_ENV, str(cache))
    return cache


def _client(url: str) -> Callable[[], Any]:
    docker = pytest.importorskip("docker")
    return lambda: docker.DockerClient(base_url=url)


def _containers(url: str) -> list[Any]:
    client = _client(url)()
    try:
        return list(client.containers.list(all=True))
    finally:
        client.close()


def _container_creates(url: str, since: float) -> int:
    """Containers the engine created since ``since`` (a build makes one per RUN step)."""
    client = _client(url)()
    try:
        events = client.events(
            since=int(since) - 1,
            until=int(time.time()) + 1,
            decode=True,
            filters={"type": "container", "event": "create"},
        )
        return sum(1 for _ in events)
    finally:
        client.close()


def _task_image(root: Path, body: str = "RUN echo built > /built\n") -> Path:
    """A build context: a Dockerfile FROM the offline base image and one file."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "marker").write_text("from the context\n")
    (root / "Dockerfile").write_text(
        "FROM vfray-base:bookworm\nCOPY marker /testbed/marker\n" + body
    )
    return root


def _tiny_layout(root: Path, shell: bool = False) -> Path:
    """An OCI layout (tag ``tiny``) whose root holds one file and no shell (or, with ``shell``,
    an executable /bin/sh that is never run)."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        files = {"etc/hostname": (b"tiny\n", 0o644)}
        if shell:
            files["bin/sh"] = (b"#!/never/run\n", 0o755)
        for name, (data, mode) in files.items():
            folder = tarfile.TarInfo(name.split("/")[0])
            folder.type, folder.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(folder)
            entry = tarfile.TarInfo(name)
            entry.size, entry.mode = len(data), mode
            tar.addfile(entry, io.BytesIO(data))
    (root / "layer.tar").write_bytes(layer.getvalue())
    layout = root / ("tiny-sh" if shell else "tiny")
    for args in (
        ["init", "--layout", str(layout)],
        ["new", "--image", f"{layout}:tiny"],
        ["raw", "add-layer", "--image", f"{layout}:tiny", str(root / "layer.tar")],
    ):
        subprocess.run(["umoci", *args], check=True, capture_output=True)
    return layout


def _count_calls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tool: str) -> Path:
    """Put a wrapper of the real ``tool`` first on PATH that logs each call to the file
    returned."""
    real = shutil.which(tool)
    assert real is not None
    folder = tmp_path / "wrapped"
    folder.mkdir(exist_ok=True)
    log = tmp_path / f"{tool}.calls"
    log.write_text("")
    wrapper = folder / tool
    wrapper.write_text(f'#!/bin/sh\necho "$1" >> {log}\nexec {real} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}:{os.environ['PATH']}")
    return log


# -- docker ------------------------------------------------------------------------------------


async def test_a_dockerfile_is_built_once_however_many_rollouts_ask(
    debian_in_docker: str, docker_url: str, store: Path, tmp_path: Path
) -> None:
    ref = parse_image(f"dockerfile:{_task_image(tmp_path / 'ctx')}")
    since = time.time()
    names = await asyncio.gather(
        *(docker_image(ref, _client(docker_url), engine=docker_url) for _ in range(8))
    )
    assert len(set(names)) == 1 and names[0].startswith("vfray-image:")
    # One build: one container for its one RUN step (none for the other seven asks).
    assert _container_creates(docker_url, since) == 1
    # Later asks are answered from memory; the same content elsewhere is the same image.
    copy = shutil.copytree(tmp_path / "ctx", tmp_path / "copy")
    again = await docker_image(
        parse_image(f"dockerfile:{copy}"), _client(docker_url), engine=docker_url
    )
    assert again == names[0]
    assert _container_creates(docker_url, since) == 1


def test_several_processes_on_a_node_share_one_build(
    debian_in_docker: str, docker_url: str, store: Path, tmp_path: Path
) -> None:
    context = _task_image(tmp_path / "ctx", "RUN echo other > /other\n")
    script = (
        "import asyncio, docker, sys\n"
        "from vfray.runtimes.images import docker_image, parse_image\n"
        "make = lambda: docker.DockerClient(base_url=sys.argv[1])\n"
        "print(asyncio.run(docker_image(parse_image(sys.argv[2]), make, engine=sys.argv[1])))\n"
    )
    since = time.time()
    env = {**os.environ, CACHE_ENV: str(store), "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, docker_url, f"dockerfile:{context}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
        )
        for _ in range(3)
    ]
    outputs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    assert len({out.strip() for out, _ in outputs}) == 1
    assert _container_creates(docker_url, since) == 1


async def test_archives_and_layouts_are_loaded_by_content(
    docker_url: str, store: Path, tmp_path: Path
) -> None:
    layout = _tiny_layout(tmp_path)
    oci_archive = tmp_path / "tiny-oci.tar"
    subprocess.run(["tar", "-C", str(layout), "-cf", str(oci_archive), "."], check=True)
    docker_archive = tmp_path / "tiny-docker.tar"
    subprocess.run(
        [*SKOPEO, "copy", "--quiet", f"oci:{layout}:tiny",
         f"docker-archive:{docker_archive}:team/tiny:1"],
        check=True,
        capture_output=True,
    )  # fmt: skip
    make = _client(docker_url)
    names = {}
    for text in (
        f"oci:{layout}:tiny",
        f"oci:{layout}",  # the layout's only tag
        f"oci-archive:{oci_archive}",
        f"docker-archive:{docker_archive}",
        f"docker-archive:{docker_archive}:team/tiny:1",
    ):
        names[text] = await docker_image(parse_image(text), make, engine=docker_url)
    client = make()
    try:
        ids = {text: client.images.get(name).id for text, name in names.items()}
    finally:
        client.close()
    # One image (the same layers and config) whichever way it came in.
    assert len(set(ids.values())) == 1, ids
    with pytest.raises(SandboxError, match=r"no image 'team/other:2' in it \(tags: "):
        await docker_image(
            parse_image(f"docker-archive:{docker_archive}:team/other:2"), make, engine=docker_url
        )


async def test_a_task_image_is_the_containers_root_and_workdir_its_cwd(
    debian_in_docker: str, docker_url: str, store: Path, tmp_path: Path
) -> None:
    context = _task_image(tmp_path / "ctx")
    spec = RuntimeSpec(image=f"dockerfile:{context}", workdir="/testbed")
    box = DockerRuntime(spec, base_url=docker_url)
    try:
        await box.start()
        where = await box.run(["pwd"])
        marker = await box.run(["cat", "marker"])
        python = await box.run(["python3", "-c", "import sys; print(sys.prefix)"])
        built = await box.read("/built")
    finally:
        await box.stop()
    assert (where.stdout, marker.stdout) == ("/testbed\n", "from the context\n")
    assert python.stdout == "/usr\n"  # the image's own Debian Python
    assert built == b"built\n"
    assert [c for c in _containers(docker_url) if c.labels.get("vfray.box") == box.box_id] == []


async def test_a_registry_image_the_engine_has_is_never_pulled(
    debian_in_docker: str, docker_url: str, store: Path
) -> None:
    """How a cluster with no registry pre-loads images: into each node's engine, by name."""
    since = time.time()
    name = await docker_image(parse_image(debian_in_docker), _client(docker_url), engine=docker_url)
    assert name == debian_in_docker
    client = _client(docker_url)()
    try:
        pulls = client.events(
            since=int(since) - 1,
            until=int(time.time()) + 1,
            decode=True,
            filters={"type": "image", "event": "pull"},
        )
        assert list(pulls) == []
    finally:
        client.close()


# -- bad images --------------------------------------------------------------------------------


async def _refused(docker_url: str, image: str) -> str:
    box = DockerRuntime(RuntimeSpec(image=image), base_url=docker_url)
    try:
        with pytest.raises(SandboxError) as caught:
            await box.start()
    finally:
        await box.stop()
    message = str(caught.value)
    assert "\n" not in message
    assert [c for c in _containers(docker_url) if c.labels.get("vfray.box") == box.box_id] == []
    return message


async def test_an_image_that_does_not_exist_carries_the_engines_message(
    docker_url: str, store: Path
) -> None:
    message = await _refused(docker_url, NO_REGISTRY)
    assert message.startswith(f"cannot pull image {NO_REGISTRY!r}: ")
    assert "127.0.0.1:9" in message and "connection refused" in message.lower()


async def test_a_failed_build_leaves_no_container(
    debian_in_docker: str, docker_url: str, store: Path, tmp_path: Path
) -> None:
    context = _task_image(tmp_path / "ctx", "RUN echo nope >&2; exit 3\n")
    before = {c.id for c in _containers(docker_url)}
    message = await _refused(docker_url, f"dockerfile:{context}")
    assert message.startswith(f"cannot build image 'dockerfile:{context}/Dockerfile")
    assert "returned a non-zero code: 3" in message
    # The build's own intermediate containers are gone too.
    assert {c.id for c in _containers(docker_url)} == before


async def test_an_image_without_a_shell_is_refused_clearly(
    docker_url: str, store: Path, tmp_path: Path
) -> None:
    layout = _tiny_layout(tmp_path)
    message = await _refused(docker_url, f"oci:{layout}:tiny")
    assert "has no sleep or /bin/sh" in message


# -- unpacked roots (for bwrap) ----------------------------------------------------------------


async def test_an_image_is_unpacked_once_into_a_whole_root(
    debian_image: Any, store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As root, one tar (in a bwrap box) per layer of the one-layer base; else one umoci unpack.
    tool, once = ("bwrap", ["--unshare-ipc"]) if can_untar() else ("umoci", ["unpack"])
    calls = _count_calls(tmp_path, monkeypatch, tool)
    ref = parse_image(debian_image.oci)
    roots = await asyncio.gather(*(rootfs(ref) for _ in range(6)))
    assert len(set(roots)) == 1
    root = roots[0]
    assert calls.read_text().split() == once
    assert root.parent.parent == store / "rootfs" and root.name == "rootfs"
    assert has_shell(root) and (root / "usr/bin/python3").exists()
    assert image_config(root).env["PATH"].startswith("/usr/local/sbin:")
    assert list((store / "tmp").iterdir()) == []  # no scratch dir left
    assert await rootfs(ref) == root
    assert calls.read_text().split() == once


async def test_each_store_unpacks_its_own_root_and_a_removed_one_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A root unpacked in one process was kept by content alone: another store (another
    $VFRAY_IMAGE_CACHE) was handed the first store's root, and a removed root its old path."""
    ref = f"oci:{_tiny_layout(tmp_path, shell=True)}:tiny"
    roots = {}
    for name in ("a", "b"):
        monkeypatch.setenv(CACHE_ENV, str(tmp_path / name))
        roots[name] = await rootfs(ref)
        assert roots[name].is_relative_to(tmp_path / name) and has_shell(roots[name])
    shutil.rmtree(tmp_path / "b")  # the store pruned
    assert await rootfs(ref) == roots["b"] and has_shell(roots["b"])


async def test_archives_are_copied_to_a_layout_then_unpacked(store: Path, tmp_path: Path) -> None:
    """Docker and OCI archives go through skopeo into a scratch layout, removed after."""
    layout = _tiny_layout(tmp_path, shell=True)
    docker_archive, oci_archive = tmp_path / "docker.tar", tmp_path / "oci.tar"
    subprocess.run(
        [*SKOPEO, "copy", "--quiet", f"oci:{layout}:tiny", f"docker-archive:{docker_archive}:t:1"],
        check=True,
        capture_output=True,
    )
    subprocess.run(["tar", "-C", str(layout), "-cf", str(oci_archive), "."], check=True)
    for text in (f"docker-archive:{docker_archive}", f"oci-archive:{oci_archive}"):
        root = await rootfs(text)
        assert has_shell(root) and (root / "etc/hostname").read_text() == "tiny\n"
    assert list((store / "tmp").iterdir()) == []


async def test_a_dockerfile_root_is_built_by_the_engine_then_unpacked(
    docker_url: str, store: Path, tmp_path: Path
) -> None:
    """What bwrap calls for a Dockerfile task: the reference as text and the node's engine
    (a small image FROM scratch: the export and unpack of the 268 MB base take ~50 s here)."""
    context = tmp_path / "ctx"
    context.mkdir()
    (context / "sh").write_text("#!/never/run\n")
    (context / "sh").chmod(0o755)
    (context / "marker").write_text("from the context\n")
    (context / "Dockerfile").write_text(
        "FROM scratch\nCOPY sh /bin/sh\nCOPY marker /testbed/marker\n"
    )
    root = await rootfs(f"dockerfile:{context}", docker_url=docker_url)
    assert (root / "testbed/marker").read_text() == "from the context\n" and has_shell(root)
    assert list((store / "tmp").iterdir()) == []
    (context / "marker").write_text("changed\n")  # other content, not unpacked yet; no engine
    with pytest.raises(SandboxError, match=r"building a Dockerfile needs a Docker engine"):
        await rootfs(f"dockerfile:{context}")


async def test_a_root_without_a_shell_is_refused_and_not_kept(store: Path, tmp_path: Path) -> None:
    ref = parse_image(f"oci:{_tiny_layout(tmp_path)}:tiny")
    with pytest.raises(SandboxError, match=r"has no /bin/sh"):
        await rootfs(ref)
    assert not (store / "rootfs").exists() or list((store / "rootfs").iterdir()) == []
    assert list((store / "tmp").iterdir()) == []
    # Asked again: the same answer without a second unpack.
    with pytest.raises(SandboxError, match=r"has no /bin/sh"):
        await rootfs(ref)


async def test_a_registry_image_without_an_engine_is_one_line(store: Path) -> None:
    with pytest.raises(SandboxError) as caught:
        await rootfs(parse_image(NO_REGISTRY))
    assert str(caught.value).startswith(f"cannot unpack image {NO_REGISTRY!r}: skopeo: ")
    assert "\n" not in str(caught.value)


def test_has_shell_follows_links_inside_the_root(tmp_path: Path) -> None:
    (tmp_path / "usr/bin").mkdir(parents=True)
    (tmp_path / "bin").symlink_to("usr/bin")
    (tmp_path / "usr/bin/dash").write_text("")
    (tmp_path / "usr/bin/dash").chmod(0o755)
    (tmp_path / "usr/bin/sh").symlink_to("/usr/bin/dash")  # absolute: inside the root
    assert has_shell(tmp_path)
    (tmp_path / "usr/bin/sh").unlink()
    (tmp_path / "usr/bin/sh").symlink_to("/bin/bash")  # the host has one; the root has not
    assert not has_shell(tmp_path)


# -- a node without a containers trust policy ---------------------------------------------------


def test_local_images_get_a_policy_only_where_the_node_has_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """skopeo and podman load no image without a trust policy; a node without one (its
    containers-common setup cut off) gets vfray's for local files, never for a registry."""
    home, where = tmp_path / "home", tmp_path / "scratch"
    home.mkdir()
    monkeypatch.setattr(_trust_policy, "SYSTEM_POLICY", tmp_path / "no-such-policy.json")
    args = _trust_policy.local_policy_args("--policy", "oci-archive", where, home=str(home))
    assert args == ["--policy", str(where / _trust_policy.POLICY_NAME)]
    assert _trust_policy.local_policy_args("--policy", "docker", where, home=str(home)) == []
    # skopeo takes the file and copies a local layout under it; anything else it rejects.
    layout = _tiny_layout(tmp_path)
    copied = subprocess.run(
        ["skopeo", *args, "copy", "--quiet", f"oci:{layout}:tiny", f"oci:{tmp_path / 'out'}:t"],
        capture_output=True,
        text=True,
    )
    assert copied.returncode == 0, copied.stderr
    policy = json.loads(Path(args[1]).read_text())
    assert policy["default"] == [{"type": "reject"}]
    assert set(policy["transports"]) == {"oci", "oci-archive", "docker-archive", "dir"}
    # The node's own policy (here the user's) is left to apply.
    (home / ".config/containers").mkdir(parents=True)
    (home / ".config/containers/policy.json").write_text('{"default": [{"type": "reject"}]}')
    assert _trust_policy.local_policy_args("--policy", "oci", where, home=str(home)) == []
