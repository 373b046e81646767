"""Plumbing shared by the harnesses of real agent programs (mini-swe-agent, codex, claude-code):
the typed config every one takes, provisioning the program into the node's tool dir during
setup (or naming it to a runtime that builds it into the box's image, Modal), the launch
environment, and keeping the agent's own transcript files.
"""

from __future__ import annotations

import abc
import asyncio
import os
import shlex
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from pydantic import Field

from vfray.errors import ConfigError, HarnessError, SandboxError
from vfray.harnesses.base import Harness, HarnessConfig
from vfray.runtimes.base import ProgramResult, Runtime
from vfray.runtimes.provision import (
    InstalledTool,
    ToolSpec,
    ensure_tool,
    find_tool,
    installer_path,
    planned_tool,
    tools_root,
)
from vfray.runtimes.registry import runtime_class
from vfray.trace import AgentArtifact, Message

AGENT_DIR = ".vfray/agent"
"""Folder (relative to the box's work dir) for the agent's config and transcript files."""
HOST_FILESYSTEM_RUNTIMES = ("subprocess", "bwrap", "docker")
"""Runtimes whose boxes see the node's tool dir (bwrap and docker mount it read-only); a runtime
with ``TOOLS_IN_IMAGE`` (modal) builds the program into the box's image instead."""


class AgentHarnessConfig(HarnessConfig):
    """Options every real-agent harness takes, on top of ``env`` and ``extra_args``."""

    version: str
    """The agent program's version to provision (subclasses pin a tested default)."""
    max_steps: int = Field(100, gt=0)
    """Model calls per run before the agent gives up, where the agent has such a limit."""


class ProvisionedHarness(Harness):
    """A harness whose program is an installed agent; subclasses give :meth:`tool_spec`,
    the launch, and ``ARTIFACTS`` (box paths of transcript files to keep)."""

    config_type: ClassVar[type[HarnessConfig]] = AgentHarnessConfig
    config: AgentHarnessConfig
    ARTIFACTS: ClassVar[tuple[str, ...]] = ()

    NEEDS_CONTAINER = False
    EXECUTES_CODE = True

    def __init__(self, config: HarnessConfig | Mapping[str, Any] | None = None) -> None:
        super().__init__(config)
        # The root exists before any box starts, so a bwrap box (which binds it at start) sees
        # the install the first rollout's setup makes.
        os.makedirs(self.tools_root, exist_ok=True)
        self._tool: InstalledTool | None = None

    @classmethod
    def agent_files(cls) -> frozenset[str]:
        """Its program's home and transcript, under :data:`AGENT_DIR`, named by the harness's
        id and those of the harnesses it subclasses (whose module's paths it keeps using)."""
        return frozenset(
            c.__dict__["id"]
            for c in cls.__mro__
            if "id" in c.__dict__ and issubclass(c, ProvisionedHarness)
        )

    @property
    def tools_root(self) -> str:
        """The node's tool root: ``$VFRAY_TOOLS_DIR`` or ``~/.cache/vfray/tools``. A property of
        the node, not of a run, so every box runtime (bwrap binds it) agrees on it."""
        return str(tools_root())

    @abc.abstractmethod
    def tool_spec(self) -> ToolSpec:
        """The agent program to provision (name, version, npm or PyPI)."""

    def box_tools(self) -> tuple[ToolSpec, ...]:
        return (self.tool_spec(),)

    def preflight(self, runtime_type: str) -> None:
        """Refuse a run whose agent is not in the node's tool dir yet when the programs that
        install it are missing here: ``npm`` and the ``node`` it runs on (npm agents), ``uv``
        (PyPI agents). Every rollout would otherwise fail on it, one by one. A runtime that
        builds the agent into its image (modal) installs it there instead."""
        if runtime_class(runtime_type).TOOLS_IN_IMAGE:
            return
        spec = self.tool_spec()
        if find_tool(spec, self.tools_root) is not None:
            return
        needed = ("npm", "node") if spec.kind == "npm" else ("uv",)
        missing = [p for p in needed if installer_path(p) is None]
        if missing:
            raise ConfigError(
                f"harness {self.id!r} installs {spec.requirement} into the node's tool dir "
                f"({self.tools_root}) with {' and '.join(needed)}, but this machine has no "
                f"{', no '.join(missing)} on PATH; install "
                + ("Node.js (it brings npm)" if spec.kind == "npm" else "uv (pip install uv)")
                + " or provision the tool dir beforehand"
            )

    async def setup(self, runtime: Runtime) -> None:
        """Provision the program on this node (once; later rollouts find it installed), or
        nothing for a box whose image has it built in."""
        await self.install_skills(runtime)
        if runtime.TOOLS_IN_IMAGE:
            return
        if runtime.type not in HOST_FILESYSTEM_RUNTIMES:
            raise HarnessError(
                f"harness {self.id!r} runs its program from the node's tool dir, which runtime "
                f"{runtime.type!r} cannot mount; use 'modal' or "
                + " or ".join(repr(r) for r in HOST_FILESYSTEM_RUNTIMES)
            )
        await self.installed()

    async def box_tool(self, runtime: Runtime) -> InstalledTool:
        """The program where ``runtime``'s box sees it: the node's install (mounted at the same
        path), or the layer its image was built with (same path, nothing installed here)."""
        if runtime.TOOLS_IN_IMAGE:
            return planned_tool(self.tool_spec(), self.tools_root)
        return await self.installed()

    async def installed(self) -> InstalledTool:
        """The provisioned program (installing it on first use)."""
        if self._tool is None:
            # One harness object serves many rollouts: they all resolve to the same dir.
            self._tool = await asyncio.to_thread(ensure_tool, self.tool_spec(), self.tools_root)
        return self._tool

    async def run_logged(
        self,
        runtime: Runtime,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        stdout_path: str,
        timeout: float | None,
        box_paths: Sequence[str] = (),
        append: bool = False,
        prelude: str = "",
    ) -> ProgramResult:
        """Run ``argv`` with its stdout (the agent's JSON event stream, its transcript) going to
        ``stdout_path`` in the box rather than the capped capture; the variables named in
        ``box_paths`` hold paths relative to the work dir and are made absolute (agents resolve
        their config homes against changing dirs). The result's stdout is the stream's tail,
        so a failure's message shows the agent's last events. With ``append`` the stream
        follows what ``stdout_path`` already holds (a resumed segment's after the first's).
        ``prelude`` is shell run first, after the exports, in the same shell (no command of its
        own for vfray to start)."""
        exports = "".join(f'{v}="$PWD/${v}"; export {v}; ' for v in box_paths)
        redirect = ">>" if append else ">"
        script = f'{exports}{prelude}exec "$0" "$@" {redirect} {shlex.quote(stdout_path)}'
        # The node's program as the box must start it (through the node's loader in an image).
        argv = runtime.program_argv(argv, env)
        result = await runtime.run_program(["/bin/sh", "-c", script, *argv], env, timeout=timeout)
        if result.ok:
            return result
        try:
            tail = (await runtime.read(stdout_path)).decode("utf-8", errors="replace")[-4000:]
        except (SandboxError, OSError):
            return result
        return result.model_copy(update={"stdout": result.stdout + tail})

    async def collect_artifacts(self, runtime: Runtime) -> list[AgentArtifact]:
        kept = []
        for path in self.ARTIFACTS:
            try:
                raw = await runtime.read(path)
            except (SandboxError, OSError):
                continue  # the program died before writing it
            kept.append(AgentArtifact.of_bytes(os.path.basename(path), raw))
        return kept


def prompt_text(messages: list[dict[str, object]]) -> str:
    """A resolved prompt as one task text (these agents take the task as a single string)."""
    return "\n\n".join(Message.model_validate(m).text for m in messages if m.get("content"))
