"""The ``swe-agent`` harness: SWE-agent 1.x (github.com/SWE-agent/SWE-agent) run as ``sweagent
run`` in the box, with its SWE-ReX deployment ``local`` (the box is the sandbox), its model
``openai/MODEL`` through litellm against the interception, the task's text as its problem
statement and the box's work dir as its (pre-existing, never reset) repository.

SWE-agent is not on PyPI (``sweagent`` there is a 0.0.1 placeholder), so it is provisioned from
the ``source`` the user names: a ``git+URL[@REF]`` (cloned with the node's ``git``), a local
source tree, or an archive of one (``.tar.gz``, ``.zip``). The tree is kept in the node's tool
dir, because SWE-agent reads its ``config/`` and ``tools/`` folders from there (a wheel has
neither); its package goes into a uv venv beside a pinned ``swe-rex``, as for the PyPI agents.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field

from vfray.errors import ConfigError, HarnessError, SandboxError
from vfray.harnesses.base import HarnessConfig, LaunchContext
from vfray.harnesses.chat import openai_base_url
from vfray.harnesses.provisioned import (
    AGENT_DIR,
    AgentHarnessConfig,
    ProvisionedHarness,
    prompt_text,
)
from vfray.runtimes.base import ProgramResult, Runtime
from vfray.runtimes.provision import InstalledTool, ToolSpec, node_lock
from vfray.runtimes.registry import runtime_class

UPSTREAM = "git+https://github.com/SWE-agent/SWE-agent@v1.1.0"
"""The default source: SWE-agent's latest 1.x release tag (needs the internet and ``git``)."""
TASK_PATH = f"{AGENT_DIR}/swe-agent-task.md"
OUTPUT_DIR = f"{AGENT_DIR}/swe-agent"
LOG_PATH = f"{AGENT_DIR}/swe-agent.log"
HOME = f"{AGENT_DIR}/swe-agent-home"
INSTANCE = "vfray"
"""The problem statement's id: SWE-agent names its trajectory ``OUTPUT_DIR/ID/ID.traj``."""
ARCHIVES = (".tar.gz", ".tgz", ".tar", ".zip")
CLONE_TIMEOUT = 600.0
_SKIP = {".git", "build", "__pycache__", "trajectories"}
"""Left out of a local tree's fingerprint (and copy): what building or running it writes."""


class SweAgentConfig(AgentHarnessConfig):
    """Options of the swe-agent harness."""

    version: str = "1.4.0"
    """SWE-ReX (PyPI ``swe-rex``), SWE-agent's runtime, pinned beside the source's package."""
    source: str = UPSTREAM
    """Where SWE-agent comes from: ``git+URL[@REF]``, a source tree, or an archive of one."""
    sweagent_config: str = "bash_only.yaml"
    """SWE-agent's agent config: a file of its ``config/`` folder or an absolute path. The
    default, ``bash_only.yaml``, takes a thought and one fenced bash block per step and ends
    with ``submit``; it installs no tool bundle that needs a Python in the box."""
    command_timeout: float = Field(120.0, gt=0)
    """Seconds one shell command may run (SWE-agent's ``tools.execution_timeout``)."""
    model_retries: int = Field(2, ge=0)
    """SWE-agent's retries of a failed model call (its default, 20 waits of up to 120 s,
    would keep a refused rollout's program alive until the stop grace ends it)."""


def _fingerprint(tree: Path) -> str:
    """A digest of a local tree's files (paths, sizes, mtimes): an edit installs it anew."""
    digest = hashlib.sha256()
    for folder, dirs, files in os.walk(tree):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP and not d.endswith(".egg-info"))
        for name in sorted(files):
            st = os.stat(os.path.join(folder, name))
            rel = os.path.relpath(os.path.join(folder, name), tree)
            digest.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def _source_root(tree: Path) -> Path:
    """The SWE-agent tree in ``tree``: itself, or its one top folder (a GitHub archive's)."""
    if (tree / "sweagent").is_dir():
        return tree
    entries = [p for p in tree.iterdir() if p.is_dir()]
    if len(entries) == 1 and (entries[0] / "sweagent").is_dir():
        return entries[0]
    return tree


def _git_url(source: str) -> tuple[str, str]:
    """``git+URL[@REF]`` as (URL, REF): an ``@`` after the URL's last ``/`` starts the ref
    (``ssh://git@host/repo`` has none)."""
    url = source[len("git+") :]
    at = url.rfind("@")
    if at > url.rfind("/"):
        return url[:at], url[at + 1 :]
    return url, ""


def _git(argv: list[str], source: str) -> None:
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=CLONE_TIMEOUT, check=False,
            env={**os.environ, "GIT_TERMINAL_PROMPT": "0"},
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise HarnessError(f"cannot fetch SWE-agent from {source}: git ran past "
                           f"{CLONE_TIMEOUT:g}s") from None  # fmt: skip
    if done.returncode != 0:
        lines = [ln.strip() for ln in (done.stderr or done.stdout).splitlines() if ln.strip()]
        why = next((ln for ln in lines if "fatal" in ln.lower()), lines[-1] if lines else "")
        raise HarnessError(f"cannot fetch SWE-agent from {source}: {why[:300]}")


class SweAgentHarness(ProvisionedHarness):
    """SWE-agent: one bash command per step (its ``bash_only`` config), ends with ``submit``."""

    id = "swe-agent"
    config_type: ClassVar[type[HarnessConfig]] = SweAgentConfig
    config: SweAgentConfig
    ARTIFACTS = (LOG_PATH, f"{OUTPUT_DIR}/{INSTANCE}/{INSTANCE}.traj")

    def __init__(self, config: HarnessConfig | Mapping[str, Any] | None = None) -> None:
        super().__init__(config)
        self._tree: Path | None = None

    # -- where the source is -------------------------------------------------------------------

    def _kind(self) -> str:
        """``git``, ``dir`` or ``archive``; a source that is none of them is refused."""
        source = self.config.source
        if source.startswith("git+"):
            return "git"
        path = Path(source).expanduser()
        if source.endswith(".whl"):
            raise ConfigError(
                f"harness 'swe-agent' cannot run from the wheel {source}: SWE-agent reads its "
                "config/ and tools/ folders from its source tree; name the tree, an archive of "
                "it or a git+URL"
            )
        if path.is_dir():
            if not (path / "sweagent").is_dir() or not (path / "tools").is_dir():
                raise ConfigError(
                    f"harness 'swe-agent': {source} is not a SWE-agent source tree (no "
                    "sweagent/ and tools/ folders)"
                )
            return "dir"
        if path.is_file() and source.endswith(ARCHIVES):
            return "archive"
        raise ConfigError(
            f"harness 'swe-agent' has no SWE-agent source: {source!r} is no git+URL, source "
            "tree or archive here (SWE-agent is not on PyPI; set the harness option source, "
            f"e.g. {UPSTREAM!r})"
        )

    def tree(self) -> Path:
        """Where the source tree is (or will be) in the node's tool dir, keyed by the source
        (and, for a local tree or archive, by its content)."""
        if self._tree is None:
            kind, source = self._kind(), self.config.source
            key = source
            if kind == "dir":
                path = Path(source).expanduser().resolve()
                key = f"{path}\0{_fingerprint(path)}"
            elif kind == "archive":
                st = Path(source).expanduser().resolve().stat()
                key = f"{Path(source).resolve()}\0{st.st_size}\0{st.st_mtime_ns}"
            digest = hashlib.sha256(key.encode()).hexdigest()[:16]
            self._tree = Path(self.tools_root) / f"swe-agent-source-{digest}"
        return self._tree

    def _fetch(self) -> Path:
        """Put the source tree in place (once per node; a finished tree has its marker)."""
        final = self.tree()
        marker = final / ".vfray-source"
        if marker.is_file():
            return final
        kind, source = self._kind(), self.config.source
        for stale in final.parent.glob(f".staging-{final.name}-*"):  # a fetch that was killed
            shutil.rmtree(stale, ignore_errors=True)
        staging = final.with_name(f".staging-{final.name}-{uuid.uuid4().hex[:8]}")
        try:
            if kind == "git":
                url, ref = _git_url(source)
                git = shutil.which("git")
                if git is None:
                    raise HarnessError(
                        f"cannot fetch SWE-agent from {source}: git is not installed"
                    )
                if re.fullmatch(r"[0-9a-f]{7,40}", ref):  # a commit: no shallow clone names it
                    _git([git, "clone", "--quiet", url, str(staging)], source)
                    _git([git, "-C", str(staging), "checkout", "--quiet", ref], source)
                else:
                    branch = ["--branch", ref] if ref else []
                    argv = [git, "clone", "--quiet", "--depth", "1", *branch, url, str(staging)]
                    _git(argv, source)
            elif kind == "dir":
                ignore = shutil.ignore_patterns(*_SKIP, "*.egg-info")
                shutil.copytree(Path(source).expanduser(), staging, ignore=ignore, symlinks=True)
            else:
                with tempfile.TemporaryDirectory(dir=final.parent) as unpacked:
                    shutil.unpack_archive(str(Path(source).expanduser()), unpacked)
                    shutil.move(str(_source_root(Path(unpacked))), staging)
            if not (staging / "sweagent").is_dir() or not (staging / "tools").is_dir():
                raise HarnessError(f"{source} holds no SWE-agent source tree (sweagent/, tools/)")
            (staging / "trajectories").mkdir(exist_ok=True)  # SWE-agent asserts it exists
            (staging / ".vfray-source").write_text(f"{source}\n")
            if final.exists():
                shutil.rmtree(final)  # a tree without its marker: a fetch that died
            os.rename(staging, final)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            if final.exists() and not marker.is_file():
                shutil.rmtree(final, ignore_errors=True)
            raise
        return final

    # -- provisioning --------------------------------------------------------------------------

    def tool_spec(self) -> ToolSpec:
        return ToolSpec(
            name="swe-agent",
            kind="pypi",
            package="swe-rex",
            version=self.config.version,
            packages=(f"sweagent @ {self.tree().as_uri()}",),
        )

    def preflight(self, runtime_type: str) -> None:
        """Refuse in one line a source that is not there, and a runtime whose image would not
        carry the node's source tree (modal)."""
        if runtime_class(runtime_type).TOOLS_IN_IMAGE:
            raise ConfigError(
                f"harness 'swe-agent' runs from a source tree in the node's tool dir, which "
                f"runtime {runtime_type!r} does not mount; use bwrap, docker or subprocess"
            )
        if self._kind() == "git" and shutil.which("git") is None:
            raise ConfigError(
                f"harness 'swe-agent' clones {self.config.source} with git, which this machine "
                "lacks; install git or name a local source tree as the option source"
            )
        super().preflight(runtime_type)

    async def installed(self) -> InstalledTool:
        if self._tool is None:
            # The tree first (the venv installs its package from it), under one lock per node.
            def fetch() -> None:
                with node_lock(Path(self.tools_root) / ".locks" / f"{self.tree().name}.lock"):
                    self._fetch()

            await asyncio.to_thread(fetch)
        return await super().installed()

    # -- the run -------------------------------------------------------------------------------

    def argv(self, sweagent: str, tree: str, model: str, base_url: str) -> list[str]:
        c = self.config
        config = c.sweagent_config
        config = config if os.path.isabs(config) else f"{tree}/config/{config}"
        return [
            sweagent,
            "run",
            "--config",
            config,
            f"--agent.model.name=openai/{model}",
            f"--agent.model.api_base={base_url}",
            "--agent.model.api_key=$OPENAI_API_KEY",  # read from the env, not on the argv
            "--agent.model.per_instance_cost_limit=0",  # the served model has no price
            "--agent.model.total_cost_limit=0",
            f"--agent.model.per_instance_call_limit={c.max_steps}",
            f"--agent.model.retry.retries={c.model_retries}",
            "--agent.model.retry.min_wait=1",
            "--agent.model.retry.max_wait=5",
            f"--agent.tools.execution_timeout={int(c.command_timeout)}",
            "--env.deployment.type=local",
            "--env.repo.type=preexisting",
            "--env.repo.reset=false",  # the work dir is the task's, never reset or cleaned
            "--problem_statement.type=text_file",
            f"--problem_statement.id={INSTANCE}",
            *c.extra_args,
        ]

    def env(self, ctx: LaunchContext, path: str, tree: str) -> dict[str, str]:
        return {
            "PATH": path,
            "HOME": HOME,
            "OPENAI_API_KEY": ctx.secret,
            "SWE_AGENT_CONFIG_ROOT": tree,  # its config's relative paths (tools/...) resolve here
            "SWE_AGENT_CONFIG_DIR": f"{tree}/config",
            "SWE_AGENT_TOOLS_DIR": f"{tree}/tools",
            "SWE_AGENT_TRAJECTORY_DIR": OUTPUT_DIR,
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # else litellm downloads a cost map
            "PYTHONUNBUFFERED": "1",
            **self.config.env,
        }

    async def launch(self, ctx: LaunchContext, runtime: Runtime) -> ProgramResult:
        tool = await self.box_tool(runtime)
        tree = str(self.tree())
        await runtime.write(TASK_PATH, prompt_text(self.resolve_prompt(ctx.data)).encode())
        await runtime.write(f"{OUTPUT_DIR}/.keep", b"")
        await runtime.write(f"{HOME}/.keep", b"")
        argv = self.argv(
            tool.executable("sweagent"), tree, ctx.model, openai_base_url(ctx.endpoint)
        )
        env = self.env(ctx, tool.path_env(), tree)
        # SWE-agent's repository is a folder under the box's root, named without its leading
        # slash: the work dir itself. Its paths are made absolute where the box starts it.
        script = (
            'HOME="$PWD/$HOME"; SWE_AGENT_TRAJECTORY_DIR="$PWD/$SWE_AGENT_TRAJECTORY_DIR"; '
            'export HOME SWE_AGENT_TRAJECTORY_DIR; exec "$0" "$@" '
            '--env.repo.repo_name="${PWD#/}" '
            f'--problem_statement.path="$PWD/{TASK_PATH}" '
            f'--output_dir="$PWD/{OUTPUT_DIR}" > {shlex.quote(LOG_PATH)} 2>&1'
        )
        argv = runtime.program_argv(argv, env)
        result = await runtime.run_program(
            ["/bin/sh", "-c", script, *argv], env, timeout=ctx.timeout
        )
        if result.ok:
            return result
        try:
            tail = (await runtime.read(LOG_PATH)).decode("utf-8", errors="replace")[-4000:]
        except (SandboxError, OSError):
            return result
        return result.model_copy(update={"stdout": result.stdout + tail})
