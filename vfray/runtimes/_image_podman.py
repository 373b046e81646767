"""A task's image made present in a podman store, once per node and content: a registry image is
used as the store has it, else pulled; a ``docker-archive``, ``oci`` layout or ``oci-archive`` is
read by podman itself through its transport (``podman pull oci:PATH:TAG``: no skopeo step, unlike
the docker store); a Dockerfile is built with ``podman build``. Pulled and built images are tagged
``localhost/vfray-image:<content key>``, so the same content is never read or built twice in a
store, whichever process asks (a file lock per store and name, as for docker).
"""

from __future__ import annotations

import hashlib
import subprocess
from collections.abc import Mapping, Sequence

from vfray.errors import SandboxError
from vfray.runtimes._executor import blocking, waiting
from vfray.runtimes._image_flight import (
    ContentFailure,
    SingleFlight,
    build_slot,
    file_lock,
    image_cache_dir,
)
from vfray.runtimes._image_ref import ImageRef, content_key
from vfray.runtimes._trust_policy import local_policy_args

IMAGE_REPOSITORY = "localhost/vfray-image"
_FLIGHTS = SingleFlight()
_WORKDIRS: dict[tuple[str, str], str] = {}
"""(store, image name) -> the image's ``WORKDIR``, for names of ours (content-keyed)."""
PULL_TIMEOUT_S = 3600.0


def _one_line(text: object, limit: int = 600) -> str:
    return " ".join(str(text).split())[:limit]


def podman_image_name(ref: ImageRef, key: str) -> str:
    """The store's name for ``ref``: a registry image's own reference, else ours by content."""
    if ref.transport == "docker":
        assert ref.reference is not None
        return ref.reference
    return f"{IMAGE_REPOSITORY}:{key[:40]}"


async def podman_image(
    ref: ImageRef,
    podman: Sequence[str],
    env: Mapping[str, str],
    *,
    store: str,
    max_builds: int = 2,
    build_args: Sequence[str] = (),
) -> str:
    """Make ``ref`` present in the store that ``podman`` (the command, with ``env``) uses, named
    ``store`` for locking, and return the name to run it by. At most ``max_builds`` pulls and
    builds at once on the node; a failure is one :class:`SandboxError` line with podman's
    message. ``build_args`` go to ``podman build`` (its ulimits, network)."""
    key = await blocking(content_key, ref)
    name = podman_image_name(ref, key)

    async def work() -> str:
        return await waiting(_make_present, ref, name, list(podman), dict(env), store,
                             max_builds, list(build_args))  # fmt: skip

    try:
        return await _FLIGHTS.do(f"{store}\0{name}", work)
    except SandboxError as exc:
        raise SandboxError(str(exc)) from None  # a fresh error per rollout, not a shared one


def forget_podman_image(store: str, name: str) -> None:
    """Drop what this process remembers of ``name`` in ``store`` (the image was removed)."""
    _FLIGHTS.forget(f"{store}\0{name}")
    _WORKDIRS.pop((store, name), None)


async def podman_image_workdir(
    name: str, podman: Sequence[str], env: Mapping[str, str], *, store: str
) -> str:
    """The ``WORKDIR`` of image ``name`` in the store (``""`` when it has none, or when the
    store cannot say: ``podman run`` then reports the image). Asked once per process for the
    store's content-keyed names; a registry name is asked each time (its tag may move)."""
    key = (store, name)
    if key in _WORKDIRS:
        return _WORKDIRS[key]
    done = await blocking(
        _podman, list(podman), dict(env),
        ["image", "inspect", "--format", "{{.Config.WorkingDir}}", name], 60,
    )  # fmt: skip
    found = done.stdout.strip() if done.returncode == 0 else ""
    if done.returncode == 0 and name.startswith(f"{IMAGE_REPOSITORY}:"):
        _WORKDIRS[key] = found
    return found


def _podman(
    podman: list[str], env: dict[str, str], args: list[str], timeout: float = PULL_TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*podman, *args], capture_output=True, text=True, env=env, timeout=timeout, check=False
    )


def _make_present(
    ref: ImageRef,
    name: str,
    podman: list[str],
    env: dict[str, str],
    store: str,
    max_builds: int,
    build_args: list[str],
) -> str:
    cache = image_cache_dir()
    lock = cache / "locks" / f"podman-{hashlib.sha256(f'{store} {name}'.encode()).hexdigest()}"
    with file_lock(lock):
        if _podman(podman, env, ["image", "exists", name], 60).returncode == 0:
            return name
        with build_slot(cache, max_builds):
            if ref.transport == "dockerfile":
                assert ref.path is not None and ref.context is not None
                built = _podman(podman, env, ["build", "--quiet", "--pull=never", "--force-rm",
                                              *build_args, "-f", ref.path, "-t", name,
                                              ref.context])  # fmt: skip
                if built.returncode:
                    why = _one_line((built.stderr or built.stdout)[-2000:])
                    raise ContentFailure(f"cannot build image {str(ref)!r}: {why}")
                return name
            # The hidden flag of podman 4's pull; the policy file lives beside the locks.
            policy = local_policy_args(
                "--signature-policy", ref.transport, cache / "policy", home=env.get("HOME")
            )
            pulled = _podman(podman, env, ["pull", "--quiet", *policy, str(ref)])
            if pulled.returncode:
                why = _one_line(pulled.stderr or pulled.stdout)
                if ref.transport == "docker":  # a registry may answer next time
                    raise SandboxError(f"cannot pull image {str(ref)!r}: podman: {why}")
                # An archive or layout that does not read fails the same way again.
                raise ContentFailure(f"cannot read image {str(ref)!r}: podman: {why}")
            if ref.transport != "docker":
                image_id = pulled.stdout.split()[-1] if pulled.stdout.split() else ""
                tagged = _podman(podman, env, ["tag", image_id, name], 60)
                if not image_id or tagged.returncode:
                    why = _one_line(tagged.stderr or pulled.stdout)
                    raise SandboxError(f"cannot tag image {str(ref)!r} as {name}: {why}")
    return name
