"""The ``terminus-2`` harness: the terminal-bench reference agent (Harbor's ``Terminus2``, JSON
format) as vfray's own stdlib program (``programs/terminus_loop.py``) in the box, driving a tmux
session there and calling the model through the interception. The program runs from a read-only
copy made once per node under the tools root; a rollout writes only its task file.

tmux comes from the node's tool dir: the node's own ``tmux`` is copied there once, with the
shared libraries it needs beyond glibc and a few terminfo entries, behind a wrapper that starts
it through the box's loader with those libraries. A box whose image has no tmux (docker's
default ``python:3.11-slim``) so runs it, as bwrap does.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import os
import py_compile
import re
import shutil
import subprocess
import sys
import uuid
from importlib import resources
from pathlib import Path
from typing import ClassVar

from pydantic import Field

from vfray.errors import ConfigError, HarnessError
from vfray.harnesses.base import PROGRAM_DIR, Harness, HarnessConfig, LaunchContext
from vfray.harnesses.chat import openai_base_url, program_source
from vfray.harnesses.provisioned import HOST_FILESYSTEM_RUNTIMES
from vfray.runtimes.base import ProgramResult, Runtime
from vfray.runtimes.provision import tools_root
from vfray.trace import Message

TRANSCRIPT_PATH = f"{PROGRAM_DIR}/terminus-transcript.json"
SKILLS_DIR = f"{PROGRAM_DIR}/terminus-skills"
"""Where the ``skills`` option is installed and the program looks for ``*/SKILL.md`` (Harbor's
``skills_dir``)."""
MANIFEST = ".vfray-tool.json"
_GLIBC = re.compile(r"^(libc|libm|libdl|libpthread|librt|libresolv|ld-linux[-\w]*)\.so")
"""Libraries the box's own C library provides: never copied (they must match its loader)."""
TERMINFO = ("xterm-256color", "xterm", "tmux-256color", "tmux", "screen-256color", "screen")
TERMINFO_DIRS = ("/etc/terminfo", "/lib/terminfo", "/usr/share/terminfo")


class Terminus2Config(HarnessConfig):
    """Options of the terminus-2 harness."""

    max_steps: int = Field(1000, gt=0)
    """Model calls ("episodes") before the program gives up."""
    max_output_bytes: int = Field(10000, gt=0)
    """Terminal output per observation (Harbor's 10,000 bytes: head and tail kept)."""
    pane_width: int = Field(160, gt=0)
    pane_height: int = Field(40, gt=0)
    request_timeout: float = Field(600.0, gt=0)
    """Seconds one model call may take."""
    retries: int = Field(2, ge=0)
    """Retries of a model call answered 429/5xx or not answered at all."""
    python: str | None = None
    """The interpreter inside the box; None: the runtime's own (``Runtime.python``)."""


@functools.cache
def loop_source() -> bytes:
    return (resources.files("vfray.harnesses") / "programs" / "terminus_loop.py").read_bytes()


def node_tmux() -> str | None:
    """The node's own tmux, or None."""
    return shutil.which("tmux")


def _libraries(binary: str) -> list[Path]:
    """The shared libraries ``binary`` loads beyond glibc's own, as ``ldd`` resolves them."""
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        name, _, rest = line.strip().partition(" => ")
        path = rest.split(" (")[0].strip()
        if path.startswith("/") and not _GLIBC.match(name):
            found.append(Path(path))
    return found


def _interpreter(binary: str) -> str:
    """The ELF loader ``binary`` names (its ``PT_INTERP``)."""
    data = Path(binary).read_bytes()[:4096]
    match = re.search(rb"(/lib\w*/ld-linux[-\w.]*\.so\.\d)\x00", data)
    return match.group(1).decode() if match else "/lib64/ld-linux-x86-64.so.2"


def ensure_tmux(tmux: str, root: Path) -> Path:
    """The node's tmux in its own dir under the tools root (made once, content-addressed by the
    binary and its libraries): ``bin/tmux`` runs it with its libraries and terminfo."""
    libs = _libraries(tmux)
    digest = hashlib.sha256(Path(tmux).read_bytes())
    for lib in libs:
        digest.update(lib.name.encode() + Path(lib).read_bytes())
    final = root / f"tmux-{digest.hexdigest()[:16]}"
    if (final / MANIFEST).is_file():
        return final
    staging = root / f".staging-{final.name}-{uuid.uuid4().hex[:8]}"
    try:
        (staging / "bin").mkdir(parents=True)
        (staging / "lib").mkdir()
        shutil.copy2(tmux, staging / "lib" / "tmux")
        for lib in libs:
            shutil.copy2(lib, staging / "lib" / lib.name)
        for name in TERMINFO:
            for folder in TERMINFO_DIRS:
                entry = Path(folder) / name[0] / name
                if entry.is_file():
                    (staging / "terminfo" / name[0]).mkdir(parents=True, exist_ok=True)
                    shutil.copy2(entry, staging / "terminfo" / name[0] / name)
                    break
        # Through the loader with --library-path, not LD_LIBRARY_PATH: the shell tmux starts
        # for the model must not inherit a library path.
        wrapper = (
            "#!/bin/sh\n"
            'd="$(dirname "$0")/.."\n'
            'TERMINFO_DIRS="$d/terminfo:/etc/terminfo:/lib/terminfo:/usr/share/terminfo"\n'
            "export TERMINFO_DIRS\n"
            f'exec {_interpreter(tmux)} --library-path "$d/lib" "$d/lib/tmux" "$@"\n'
        )
        (staging / "bin" / "tmux").write_text(wrapper)
        os.chmod(staging / "bin" / "tmux", 0o755)
        (staging / MANIFEST).write_text(json.dumps({"tmux": tmux, "libs": [str(p) for p in libs]}))
        _publish(staging, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final


def _publish(staging: Path, final: Path) -> None:
    """``staging`` renamed to ``final``, unless another process's finished copy is there."""
    try:
        os.rename(staging, final)
    except OSError:
        if not (final / MANIFEST).is_file():
            raise


def ensure_programs(root: Path) -> Path:
    """vfray's two programs (``terminus_loop.py`` and the ``chat_loop.py`` it imports) in their
    own read-only dir under the tools root, made once per node and content-addressed by their
    sources, with ``chat_loop``'s bytecode compiled for this Python: boxes run them from there
    (bwrap and docker see the tools root) instead of each rollout writing, compiling and then
    removing its own copies."""
    sources = {"chat_loop.py": program_source(), "terminus_loop.py": loop_source()}
    digest = hashlib.sha256()
    for name, source in sources.items():
        digest.update(name.encode() + b"\0" + source)
    final = root / f"terminus-2-programs-{digest.hexdigest()[:16]}"
    if (final / MANIFEST).is_file():
        return final
    staging = root / f".staging-{final.name}-{uuid.uuid4().hex[:8]}"
    try:
        staging.mkdir(parents=True)
        for name, source in sources.items():
            (staging / name).write_bytes(source)
        # Named by its final path (tracebacks); checked against the source's mtime and size,
        # which the rename keeps.
        cache = staging / "__pycache__" / f"chat_loop.{sys.implementation.cache_tag}.pyc"
        py_compile.compile(
            str(staging / "chat_loop.py"),
            cfile=str(cache),
            dfile=str(final / "chat_loop.py"),
            doraise=True,
        )
        (staging / MANIFEST).write_text(json.dumps(sorted(sources)))
        for entry in [*staging.rglob("*"), staging]:
            entry.chmod(0o555 if entry.is_dir() else 0o444)
        _publish(staging, final)
    finally:
        if staging.exists():
            staging.chmod(0o755)
            for entry in staging.rglob("*"):
                if entry.is_dir():
                    entry.chmod(0o755)
            shutil.rmtree(staging, ignore_errors=True)
    return final


class Terminus2Harness(Harness):
    """terminus-2: JSON keystroke batches into a tmux pane, the screen back as the next turn."""

    id = "terminus-2"
    config_type: ClassVar[type[HarnessConfig]] = Terminus2Config
    config: Terminus2Config

    APPENDS_SYSTEM_PROMPT = True
    NEEDS_CONTAINER = False
    EXECUTES_CODE = True
    SUPPORTS_SKILLS = True
    SKILLS_DIR = SKILLS_DIR

    def __init__(self, config: HarnessConfig | dict[str, object] | None = None) -> None:
        super().__init__(config)
        self._tmux: Path | None = None
        self._programs: Path | None = None

    def preflight(self, runtime_type: str) -> None:
        if node_tmux() is None:
            raise ConfigError(
                "harness 'terminus-2' runs tmux in the box, copied from the node's own tmux "
                "into its tool dir, but this machine has no tmux on PATH; apt-get install tmux"
            )

    async def setup(self, runtime: Runtime) -> None:
        if runtime.type not in HOST_FILESYSTEM_RUNTIMES:
            raise HarnessError(
                f"harness {self.id!r} runs tmux from the node's tool dir, which runtime "
                f"{runtime.type!r} cannot mount; use "
                + " or ".join(repr(r) for r in HOST_FILESYSTEM_RUNTIMES)
            )
        await self.tmux()
        await self.programs()
        await self.install_skills(runtime)

    async def tmux(self) -> Path:
        """The tool dir holding tmux (made on first use on this node)."""
        if self._tmux is None:
            tmux = node_tmux()
            if tmux is None:
                raise HarnessError("harness 'terminus-2' needs tmux on the node; none on PATH")
            root = tools_root()
            root.mkdir(parents=True, exist_ok=True)
            self._tmux = await asyncio.to_thread(ensure_tmux, tmux, root)
        return self._tmux

    async def programs(self) -> Path:
        """The node's dir holding the programs (made on first use on this node)."""
        if self._programs is None:
            root = tools_root()
            root.mkdir(parents=True, exist_ok=True)
            self._programs = await asyncio.to_thread(ensure_programs, root)
        return self._programs

    def argv(self, python: str, task_path: str, tmux: str, programs: Path) -> list[str]:
        c = self.config
        return [
            c.python or python,
            "-I",
            "-S",
            str(programs / "terminus_loop.py"),
            "--task",
            task_path,
            "--tmux",
            tmux,
            "--transcript",
            TRANSCRIPT_PATH,
            "--max-steps",
            str(c.max_steps),
            "--max-output-bytes",
            str(c.max_output_bytes),
            "--width",
            str(c.pane_width),
            "--height",
            str(c.pane_height),
            "--request-timeout",
            f"{c.request_timeout:g}",
            "--retries",
            str(c.retries),
            *(["--skills-dir", SKILLS_DIR] if c.skills else []),
            *c.extra_args,
        ]

    async def launch(self, ctx: LaunchContext, runtime: Runtime) -> ProgramResult:
        messages = [Message.model_validate(m) for m in self.resolve_prompt(ctx.data)]
        system = "\n\n".join(m.text for m in messages if m.role == "system")
        instruction = "\n\n".join(m.text for m in messages if m.role != "system" and m.text)
        # One file with the secret too, which the program deletes once read (as the key file
        # of ChatLoopHarness.launch): one write a rollout.
        task_path = f"{PROGRAM_DIR}/terminus-task-{uuid.uuid4().hex[:12]}.json"
        task = {"instruction": instruction, "system": system, "key": ctx.secret}
        await runtime.write(task_path, json.dumps(task, ensure_ascii=False).encode(), mode=0o600)
        env = {
            **self.config.env,
            "VFRAY_BASE_URL": openai_base_url(ctx.endpoint),
            "VFRAY_MODEL": ctx.model,
        }
        tmux = str(await self.tmux() / "bin" / "tmux")
        argv = self.argv(runtime.python, task_path, tmux, await self.programs())
        return await runtime.run_program(argv, env, timeout=ctx.timeout, signals_ready=True)
