"""The skeleton shared by the harnesses of npm agent programs (claude-code, codex, gemini-cli,
qwen-code, kimi-code, pi, opencode, openclaw): the tool spec built from class attributes (the
package, with a Node.js from npm beside it when the config names one), and one launch that
writes the agent's config files, runs its binary with its stdout (the JSON event stream) going
to the transcript file, and, for a harness that can resume, continues the box's last session on
the next user message with the CLI's own continue flag.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import ClassVar

from vfray.errors import HarnessError
from vfray.harnesses.base import LaunchContext
from vfray.harnesses.provisioned import AgentHarnessConfig, ProvisionedHarness, prompt_text
from vfray.runtimes.base import ProgramResult, Runtime
from vfray.runtimes.provision import InstalledTool, ToolSpec
from vfray.trace import Message


class NpmAgentConfig(AgentHarnessConfig):
    """Options of an npm agent that runs on a Node.js installed beside it."""

    node_version: str = "22"
    """The npm ``node`` package installed beside it: the agent's command is a Node script
    (``#!/usr/bin/env node``), and a node or box may have no node, or an older one."""


class NpmAgentHarness(ProvisionedHarness):
    """An npm agent run once per segment. Subclasses set the class attributes and give
    :meth:`arguments` and :meth:`environment` (and :meth:`write_config` when the agent reads
    config files); ``SUPPORTS_RESUME`` with :meth:`arguments` honouring ``resumed`` lets a
    task continue through ``next_message``."""

    PACKAGE: ClassVar[str]
    """The npm package (:attr:`package` may take it from the config instead)."""
    BINARY: ClassVar[str]
    """The command the package installs."""
    EVENTS_PATH: ClassVar[str]
    """Where the program's stdout goes in the box; kept on the trace."""
    BOX_PATHS: ClassVar[tuple[str, ...]] = ()
    """Environment variables holding work-dir-relative paths, made absolute at launch."""

    APPENDS_SYSTEM_PROMPT = False
    SUPPORTS_MCP = True
    SUPPORTS_SKILLS = True

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "ARTIFACTS" not in cls.__dict__ and "EVENTS_PATH" in cls.__dict__:
            cls.ARTIFACTS = (cls.EVENTS_PATH,)

    @property
    def package(self) -> str:
        return self.PACKAGE

    def tool_spec(self) -> ToolSpec:
        node = getattr(self.config, "node_version", None)
        return ToolSpec(
            name=self.id,
            kind="npm",
            package=self.package,
            version=self.config.version,
            packages=(f"node@{node}",) if node else (),
        )

    async def write_config(self, ctx: LaunchContext, runtime: Runtime) -> None:
        """Write the files the program reads before it starts (none by default)."""
        return None

    @abc.abstractmethod
    def arguments(self, ctx: LaunchContext, task: str, resumed: bool) -> list[str]:
        """The program's arguments for ``task`` (the prompt text; with ``resumed``, the new
        user message, sent into the box's last session)."""

    @abc.abstractmethod
    def environment(self, ctx: LaunchContext) -> dict[str, str]:
        """The program's environment, without ``PATH`` and the config's ``env``."""

    async def prelude(self, runtime: Runtime, tool: InstalledTool) -> str:
        """Shell run in the box before the program starts, in the shell that starts it (none by
        default)."""
        return ""

    async def checked(self, runtime: Runtime, result: ProgramResult) -> ProgramResult:
        """The segment's result as the rollout sees it (the program's, by default)."""
        return result

    async def launch(self, ctx: LaunchContext, runtime: Runtime) -> ProgramResult:
        task = prompt_text(self.resolve_prompt(ctx.data))
        return await self._run(ctx, runtime, task, resumed=False)

    async def resume(
        self, ctx: LaunchContext, runtime: Runtime, messages: Sequence[Message]
    ) -> ProgramResult:
        """Continue the box's last session with the new user message (the program keeps the
        conversation so far in its own session files, in the box's agent dir)."""
        if not self.SUPPORTS_RESUME:
            raise HarnessError(f"harness {self.id!r} cannot resume a conversation")
        if not messages or messages[-1].role != "user":
            raise HarnessError(f"harness {self.id!r} resumes on a new user message, got none")
        return await self._run(ctx, runtime, messages[-1].text, resumed=True)

    async def _run(
        self, ctx: LaunchContext, runtime: Runtime, task: str, *, resumed: bool
    ) -> ProgramResult:
        tool = await self.box_tool(runtime)
        await self.write_config(ctx, runtime)
        argv = [tool.executable(self.BINARY), *self.arguments(ctx, task, resumed)]
        # The tool dir's bin holds its own node, which the #!/usr/bin/env node scripts find.
        env = {"PATH": tool.path_env(), **self.environment(ctx), **self.config.env}
        result = await self.run_logged(
            runtime,
            argv,
            env,
            stdout_path=self.EVENTS_PATH,
            timeout=ctx.timeout,
            box_paths=self.BOX_PATHS,
            # A resumed segment's events follow the first's in the one transcript.
            append=resumed,
            prelude=await self.prelude(runtime, tool),
        )
        return await self.checked(runtime, result)
