"""A task's image made present in a Docker engine, once per node and content: a registry image
is used as the engine has it, else pulled; a ``docker-archive`` is loaded; an OCI layout or
archive goes through ``skopeo copy`` to a docker archive, then is loaded; a Dockerfile is built.
Loaded and built images are tagged ``vfray-image:<content key>``, so the same content is never
loaded or built twice on a node, whichever process asks.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vfray.errors import SandboxError
from vfray.runtimes._executor import blocking, waiting
from vfray.runtimes._image_flight import (
    ContentFailure,
    SingleFlight,
    build_slot,
    file_lock,
    image_cache_dir,
    scratch_dir,
)
from vfray.runtimes._image_ref import ImageRef, content_key
from vfray.runtimes._trust_policy import local_policy_args

IMAGE_REPOSITORY = "vfray-image"
LOG_TAIL_LINES = 8
"""Lines of a failed build's log quoted in its error (the engine's message comes first)."""

_FLIGHTS = SingleFlight()


def _one_line(text: object, limit: int = 600) -> str:
    return " ".join(str(text).split())[:limit]


def image_name(ref: ImageRef, key: str) -> str:
    """The engine's name for ``ref``: a registry image's own reference, else ours by content."""
    if ref.transport == "docker":
        assert ref.reference is not None
        return ref.reference
    return f"{IMAGE_REPOSITORY}:{key[:40]}"


async def docker_image(
    ref: ImageRef,
    make_client: Callable[[], Any],
    *,
    engine: str,
    max_builds: int = 2,
    build_network: str | None = None,
) -> str:
    """Make ``ref`` present in the engine at ``engine`` (``make_client`` opens a client to it)
    and return the name to run it by. The first ask on a node does the work; every other ask,
    concurrent or later, in this process or another, finds it done. At most ``max_builds``
    pulls, loads and builds run at once on the node. A failure is one :class:`SandboxError`
    line carrying the engine's (or skopeo's) message."""
    key = await blocking(content_key, ref)
    name = image_name(ref, key)
    flight = f"{engine}\0{name}"

    async def work() -> str:
        return await waiting(
            _make_present, ref, name, make_client, engine, max_builds, build_network
        )

    try:
        return await _FLIGHTS.do(flight, work)
    except SandboxError as exc:
        raise SandboxError(str(exc)) from None  # a fresh error per rollout, not a shared one


def forget(engine: str, name: str) -> None:
    """Drop what this process remembers of ``name`` in ``engine`` (the image was removed)."""
    _FLIGHTS.forget(f"{engine}\0{name}")


def _make_present(
    ref: ImageRef,
    name: str,
    make_client: Callable[[], Any],
    engine: str,
    max_builds: int,
    build_network: str | None,
) -> str:
    cache = image_cache_dir()
    lock = cache / "locks" / f"docker-{hashlib.sha256(f'{engine} {name}'.encode()).hexdigest()}"
    with file_lock(lock):
        client = make_client()
        try:
            if _present(client, name, ref):
                return name
            with build_slot(cache, max_builds):
                if ref.transport == "docker":
                    _pull(client, ref)
                elif ref.transport == "docker-archive":
                    assert ref.path is not None
                    _load(client, ref, ref.path, name)
                elif ref.transport == "dockerfile":
                    _build(client, ref, name, build_network)
                else:
                    _copy_and_load(client, ref, name, cache)
        finally:
            client.close()
    return name


def _errors() -> Any:
    import docker.errors

    return docker.errors


def _present(client: Any, name: str, ref: ImageRef) -> bool:
    errors = _errors()
    try:
        client.images.get(name)
    except errors.ImageNotFound:
        return False
    except errors.APIError as exc:
        raise SandboxError(f"image {str(ref)!r}: the engine failed: {_one_line(exc)}") from exc
    return True


def _pull(client: Any, ref: ImageRef) -> None:
    assert ref.reference is not None
    errors = _errors()
    try:
        for chunk in client.api.pull(ref.reference, stream=True, decode=True):
            if "errorDetail" in chunk or "error" in chunk:
                detail = chunk.get("errorDetail", {}).get("message") or chunk.get("error")
                raise SandboxError(f"cannot pull image {ref.reference!r}: {_one_line(detail)}")
    except errors.APIError as exc:
        why = _one_line(getattr(exc, "explanation", None) or exc)
        raise SandboxError(f"cannot pull image {ref.reference!r}: {why}") from exc


def _load(client: Any, ref: ImageRef, archive: str, name: str) -> None:
    errors = _errors()
    try:
        with open(archive, "rb") as data:
            images = client.images.load(data)
    except errors.ImageLoadError as exc:
        raise ContentFailure(f"cannot load image {str(ref)!r}: {_one_line(exc)}") from exc
    except errors.APIError as exc:
        raise SandboxError(f"cannot load image {str(ref)!r}: {_one_line(exc)}") from exc
    except OSError as exc:
        raise SandboxError(f"cannot load image {str(ref)!r}: {exc}") from exc
    wanted = ref.reference if ref.transport == "docker-archive" else None
    picked = [i for i in images if wanted is None or _tagged(i, wanted)]
    if not picked:
        found = ", ".join(t for i in images for t in i.tags) or "none"
        what = f"image {wanted!r}" if wanted else "image"
        raise ContentFailure(f"cannot load image {str(ref)!r}: no {what} in it (tags: {found})")
    repository, _, tag = name.partition(":")
    if not picked[0].tag(repository, tag):
        raise SandboxError(f"cannot tag image {str(ref)!r} as {name}")


def _tagged(image: Any, wanted: str) -> bool:
    tags = set(image.tags)
    return wanted in tags or (":" not in wanted.rsplit("/", 1)[-1] and f"{wanted}:latest" in tags)


def _copy_and_load(client: Any, ref: ImageRef, name: str, cache: Path) -> None:
    """An OCI layout or archive into the engine: ``skopeo copy`` to a docker archive (the
    engine's own ``load`` reads no OCI archives before Docker 25), then load it."""
    skopeo = shutil.which("skopeo")
    if skopeo is None:
        raise SandboxError(
            f"image {str(ref)!r}: skopeo is not installed (apt-get install skopeo); it turns "
            "OCI images into the engine's format"
        )
    work = scratch_dir(cache)
    try:
        archive = work / "image.tar"
        policy = local_policy_args("--policy", ref.transport, work)
        copied = subprocess.run(
            [skopeo, *policy, "copy", "--quiet", str(ref), f"docker-archive:{archive}:{name}"],
            capture_output=True,
            text=True,
        )
        if copied.returncode:
            why = _one_line(copied.stderr or copied.stdout)
            raise ContentFailure(f"cannot read image {str(ref)!r}: skopeo: {why}")
        _load(client, ref, str(archive), name)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _build(client: Any, ref: ImageRef, name: str, network: str | None) -> None:
    assert ref.path is not None and ref.context is not None
    errors = _errors()
    try:
        client.images.build(
            path=ref.context,
            dockerfile=ref.path,
            tag=name,
            rm=True,
            forcerm=True,  # no intermediate container left behind by a failed step
            pull=False,
            network_mode=network,
        )
    except errors.BuildError as exc:
        lines = [
            str(entry.get("stream", "")).strip()
            for entry in exc.build_log
            if isinstance(entry, dict) and str(entry.get("stream", "")).strip()
        ]
        tail = " | ".join(lines[-LOG_TAIL_LINES:])
        raise ContentFailure(
            f"cannot build image {str(ref)!r}: {_one_line(exc.msg)}"
            + (f" (log: {_one_line(tail)})" if tail else "")
        ) from exc
    except (errors.APIError, TypeError) as exc:
        raise SandboxError(f"cannot build image {str(ref)!r}: {_one_line(exc)}") from exc
    except OSError as exc:
        raise SandboxError(f"cannot build image {str(ref)!r}: {exc}") from exc
