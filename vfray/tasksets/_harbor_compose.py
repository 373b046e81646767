"""A Harbor task's box and its sidecars: the image of ``environment/`` (a Dockerfile, or the
primary service ``main`` of a ``docker-compose.yaml``), and the other compose services, run on
the docker runtime as containers that share the box's network namespace (each reachable from
the box at ``localhost`` and by its service name) and are removed with the box.

Internal: importable, but not the public API; names here may move.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shlex
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from vfray.errors import SandboxError, TaskError, TasksetError
from vfray.runtimes.base import LiveProcess, Runtime

COMPOSE_FILES = ("docker-compose.yaml", "docker-compose.yml", "compose.yaml", "compose.yml")
PRIMARY = "main"
_WORKDIR = re.compile(r"^\s*WORKDIR\s+(\S+)\s*$", re.IGNORECASE | re.MULTILINE)


class Sidecar(BaseModel):
    """One compose service besides ``main``."""

    model_config = ConfigDict(frozen=True)

    name: str
    image: str
    """An image reference (:func:`vfray.runtimes.images.parse_image`), ``dockerfile:`` for a
    service that is built."""
    environment: dict[str, str] = Field(default_factory=dict)
    command: list[str] | None = None


class BoxImage(BaseModel):
    """The box's image reference, its work dir (the Dockerfile's last ``WORKDIR``), and the
    sidecars."""

    model_config = ConfigDict(frozen=True)

    image: str | None
    workdir: str | None = None
    sidecars: tuple[Sidecar, ...] = ()


def dockerfile_workdir(dockerfile: Path) -> str | None:
    """The last ``WORKDIR`` of ``dockerfile`` (None when it sets none or is unreadable)."""
    try:
        found = _WORKDIR.findall(dockerfile.read_text(errors="replace"))
    except OSError:
        return None
    return found[-1] if found and found[-1].startswith("/") else None


def _dockerfile_ref(dockerfile: Path, context: Path) -> str:
    return f"dockerfile:{dockerfile.resolve()}:{context.resolve()}"


def _built(service: dict[str, Any], compose_dir: Path, name: str) -> tuple[str, str | None]:
    """A service's image reference and work dir."""
    build = service.get("build")
    if build is not None:
        if isinstance(build, str):
            context, dockerfile = compose_dir / build, "Dockerfile"
        elif isinstance(build, dict):
            context = compose_dir / str(build.get("context", "."))
            dockerfile = str(build.get("dockerfile", "Dockerfile"))
        else:
            raise TasksetError(f"compose service {name!r}: build must be a path or a table")
        path = context / dockerfile
        workdir = service.get("working_dir") or dockerfile_workdir(path)
        return _dockerfile_ref(path, context), workdir
    image = service.get("image")
    if not isinstance(image, str):
        raise TasksetError(f"compose service {name!r} has neither build nor image")
    return image, service.get("working_dir")


def _environment(raw: object) -> dict[str, str]:
    if isinstance(raw, dict):
        return {str(k): "" if v is None else str(v) for k, v in raw.items()}
    if isinstance(raw, list):
        return dict(str(item).partition("=")[::2] for item in raw)
    return {}


def read_environment(env_dir: Path, docker_image: str | None) -> BoxImage:
    """The box of a task whose environment folder is ``env_dir``: its compose file's ``main``
    service, else its Dockerfile, else the prebuilt ``docker_image``. Raises
    :class:`TasksetError` in one line when there is none of them."""
    compose = next((env_dir / f for f in COMPOSE_FILES if (env_dir / f).is_file()), None)
    if compose is not None:
        try:
            spec = yaml.safe_load(compose.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise TasksetError(f"{compose}: cannot read: {' '.join(str(exc).split())}") from exc
        services = spec.get("services") if isinstance(spec, dict) else None
        if not isinstance(services, dict) or PRIMARY not in services:
            raise TasksetError(f"{compose}: needs a service named {PRIMARY!r} (the box)")
        main = services[PRIMARY] or {}
        if "build" not in main and "image" not in main and (env_dir / "Dockerfile").is_file():
            main = {**main, "build": "."}
        image, workdir = _built(main, compose.parent, PRIMARY)
        sidecars = []
        for name, service in services.items():
            if name == PRIMARY:
                continue
            service = service or {}
            ref, _ = _built(service, compose.parent, str(name))
            command = service.get("command")
            if isinstance(command, str):
                command = shlex.split(command)
            sidecars.append(
                Sidecar(
                    name=str(name),
                    image=ref,
                    environment=_environment(service.get("environment")),
                    command=[str(c) for c in command] if command else None,
                )
            )
        return BoxImage(image=image, workdir=workdir, sidecars=tuple(sidecars))
    dockerfile = env_dir / "Dockerfile"
    if dockerfile.is_file():
        return BoxImage(
            image=_dockerfile_ref(dockerfile, env_dir), workdir=dockerfile_workdir(dockerfile)
        )
    if docker_image:
        return BoxImage(image=docker_image)
    raise TasksetError(
        f"{env_dir.parent}: no environment/Dockerfile, no docker-compose.yaml and no "
        "[environment] docker_image"
    )


class SidecarSet(LiveProcess):
    """The sidecar containers of one box, tracked by the box (:meth:`Runtime.track`) so they
    are removed when it stops; they carry the box's labels, so the owner's lifeline removes
    them too if the process dies."""

    pid = None

    def __init__(self, containers: list[Any]) -> None:
        self.containers = containers
        self._code: int | None = None

    @property
    def returncode(self) -> int | None:
        return self._code

    async def wait(self) -> int:
        while self._code is None:
            await asyncio.sleep(1.0)
        return self._code

    async def stop(self, grace: float = 0.0) -> int:
        if self._code is None:
            self._code = 0
            for container in self.containers:
                # Gone already, or the lifeline sweeps it by its labels.
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(container.remove, force=True)
        return self._code


async def start_sidecars(runtime: Runtime, sidecars: tuple[Sidecar, ...], task: str) -> None:
    """Start ``sidecars`` beside the docker box ``runtime``: each its image made present
    through the node's image store, in the box's network namespace, reachable by its name."""
    if not sidecars:
        return
    container = getattr(runtime, "container", None)
    if runtime.type != "docker" or container is None:
        names = ", ".join(s.name for s in sidecars)
        raise TaskError(
            f"task {task!r} has compose sidecars ({names}), which run only on the docker "
            f"runtime, not {runtime.type!r}"
        )
    # Here, not at the top: loading a taskset must not need the docker runtime's image store.
    from vfray.runtimes.images import docker_image, parse_image

    rt: Any = runtime
    started: list[Any] = []
    runtime.track(SidecarSet(started))
    for sidecar in sidecars:
        name = await docker_image(
            parse_image(sidecar.image),
            rt._make_client,
            engine=rt.engine_url(),
            max_builds=rt.max_builds,
            build_network=rt.build_network,
        )
        options: dict[str, Any] = {
            "detach": True,
            "network_mode": f"container:{container.id}",
            "labels": {**rt.labels(), "vfray.sidecar": sidecar.name},
            "environment": sidecar.environment,
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges"],
        }
        if sidecar.command:
            options["command"] = sidecar.command
        try:
            started.append(await asyncio.to_thread(rt.client.containers.run, name, **options))
        except Exception as exc:
            said = " ".join(str(getattr(exc, "explanation", None) or exc).split())[:300]
            raise SandboxError(f"cannot start sidecar {sidecar.name!r}: {said}") from exc
    names = " ".join(s.name for s in sidecars)
    done = await runtime.run(["/bin/sh", "-c", f"echo '127.0.0.1 {names}' >> /etc/hosts"])
    if not done.ok:
        raise SandboxError(f"cannot name the sidecars in /etc/hosts: {done.stderr.strip()}")
