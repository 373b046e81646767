"""Codex's bundled system skills, unpacked once per node: a read-only copy beside the codex tool
dir that each box's ``$CODEX_HOME/skills/.system`` links to, so Codex does not write its ~60
skill files into every rollout's home (and vfray does not remove them after each one).

Codex checks ``skills/.system/.codex-system-skills.marker`` against a fingerprint of the skills
built into its binary and unpacks them only when it differs, so a linked copy that Codex itself
made is used as it is. The model sees the same skills; the skills root it is shown is the
copy's real path (Codex resolves the link), not the box's home. A copy that is missing or stale
is no worse than none: Codex unpacks its skills into the home as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import shutil
import signal
import stat
import subprocess
import time
import uuid
from pathlib import Path

from vfray.runtimes.base import Runtime
from vfray.runtimes.provision import InstalledTool, node_lock

SYSTEM = ".system"
MARKER = ".codex-system-skills.marker"
SEED_TIMEOUT = 60.0
"""Seconds the one unpacking run on the node may take (it takes ~0.1 s)."""
_CONFIG = (
    'model = "vfray-seed"\nmodel_provider = "seed"\ncheck_for_update_on_startup = false\n'
    "[analytics]\nenabled = false\n[feedback]\nenabled = false\n"
    '[model_providers.seed]\nname = "seed"\nbase_url = "http://127.0.0.1:9/v1"\n'
    'env_key = "VFRAY_SEED_KEY"\nwire_api = "responses"\n'
)
"""A provider that is never called: ``codex debug prompt-input`` only renders the prompt."""


def seed_path(tool: InstalledTool) -> Path:
    """Where the node's copy of ``tool``'s system skills lives: a sibling of its tool dir under
    the tools root, which bwrap and docker boxes see read-only at the same path."""
    return tool.path.parent / f"{tool.path.name}.system-skills" / SYSTEM


def seeded_system_skills(tool: InstalledTool, argv: list[str]) -> Path | None:
    """The node's copy of the system skills that ``argv`` unpacks (a Codex command that loads
    its skills: ``codex debug prompt-input`` needs no model; ``codex-acp`` unpacks them as it
    starts and is then stopped), made once per node under a lock (blocking); None when it
    cannot be made."""
    seed = seed_path(tool)
    if (seed / MARKER).is_file():
        return seed
    base = seed.parent
    with node_lock(tool.path.parent / ".locks" / f"{base.name}.lock"):
        if (seed / MARKER).is_file():
            return seed
        staging = tool.path.parent / f".staging-{base.name}-{uuid.uuid4().hex[:8]}"
        home = staging / "home"
        try:
            home.mkdir(parents=True)
            (home / "config.toml").write_text(_CONFIG)
            unpacked = home / "skills" / SYSTEM
            env = {"PATH": tool.path_env(), "CODEX_HOME": str(home), "HOME": str(home)}
            if not _run_until(argv, {**env, "VFRAY_SEED_KEY": "unused"}, unpacked / MARKER):
                return None
            os.rename(unpacked, staging / SYSTEM)
            _read_only(staging / SYSTEM)
            shutil.rmtree(home, ignore_errors=True)
            if base.exists():  # a copy that died mid-rename
                _remove(base)
            os.rename(staging, base)
            return seed
        except (OSError, subprocess.SubprocessError):
            return None
        finally:
            if staging.exists():
                _remove(staging)


def _run_until(argv: list[str], env: dict[str, str], marker: Path) -> bool:
    """Run ``argv`` until it exits or ``marker`` (written last, after every skill) exists;
    whether it does. Its whole process group is killed then: npm's ``codex-acp`` is a node
    script that runs the native binary as its child, which killing node alone left running
    (orphaned, for the node's lifetime)."""
    process = subprocess.Popen(
        argv,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + SEED_TIMEOUT
        while process.poll() is None and not marker.is_file() and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    return marker.is_file()


class SystemSkillSeeds:
    """A harness's copies per tool dir (one harness object serves many rollouts)."""

    def __init__(self) -> None:
        self._seeds: dict[Path, Path | None] = {}

    async def prelude(self, runtime: Runtime, tool: InstalledTool, argv: list[str]) -> str:
        """Shell linking ``$CODEX_HOME/skills/.system`` to the node's copy that ``argv`` makes
        on first use; none for a box that sees none of the node's tool dir (Modal's), where
        Codex unpacks them itself."""
        if runtime.TOOLS_IN_IMAGE:
            return ""
        if tool.path not in self._seeds:
            self._seeds[tool.path] = await asyncio.to_thread(seeded_system_skills, tool, argv)
        seed = self._seeds[tool.path]
        return "" if seed is None else link_script(seed, "CODEX_HOME")


def link_script(seed: Path, home_var: str) -> str:
    """Shell that links ``$home_var/skills/.system`` to ``seed`` unless the home has one (a
    resumed segment's); a failure leaves Codex to unpack its skills itself."""
    target = f'"${home_var}/skills/{SYSTEM}"'
    return (
        f'[ -e {target} ] || {{ mkdir -p "${home_var}/skills" && '
        f"ln -s {shlex.quote(str(seed))} {target}; }} 2>/dev/null; "
    )


def _read_only(path: Path) -> None:
    write = stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH
    for entry in [*path.rglob("*"), path]:
        mode = entry.stat().st_mode
        entry.chmod((mode & ~write) | stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)


def _remove(path: Path) -> None:
    for entry in [path, *path.rglob("*")]:
        if entry.is_dir() and not entry.is_symlink():
            entry.chmod(entry.stat().st_mode | stat.S_IWUSR | stat.S_IXUSR)
    shutil.rmtree(path, ignore_errors=True)
