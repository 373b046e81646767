"""Harbor's ``task.toml`` (schema versions 1.0 to 1.4) read into one typed record.

Both spellings Harbor has used are read: ``version`` (1.0) and ``schema_version`` (1.1 on), the
``[task]`` table (name, description, authors, keywords), ``memory``/``storage`` as sizes
("2G") or ``memory_mb``/``storage_mb``, and ``[[steps]]`` with ``multi_step_reward_strategy``.
A key this reader does not know is a warning (Harbor ignores such keys too); a setting vfray
cannot honour is one line in :attr:`HarborConfig.unhonoured`.

Internal: importable, but not the public API; names here may move.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from vfray.errors import TasksetError

SCHEMA_VERSIONS = ("1.0", "1.1", "1.2", "1.3", "1.4")
DEFAULT_AGENT_TIMEOUT = 600.0
DEFAULT_VERIFIER_TIMEOUT = 600.0

_KNOWN: dict[str, frozenset[str]] = {
    "": frozenset(
        [
            "version",
            "schema_version",
            "task",
            "metadata",
            "agent",
            "verifier",
            "environment",
            "solution",
            "steps",
            "multi_step_reward_strategy",
            "multi_step_reward_mode",
            "source",
        ]
    ),
    "task": frozenset({"name", "description", "authors", "keywords"}),
    "agent": frozenset({"timeout_sec", "user"}),
    "verifier": frozenset({"timeout_sec", "env", "user", "environment_mode", "environment"}),
    "solution": frozenset({"env"}),
    "environment": frozenset(
        [
            "build_timeout_sec",
            "cpus",
            "memory",
            "memory_mb",
            "storage",
            "storage_mb",
            "gpus",
            "gpu_types",
            "allow_internet",
            "docker_image",
            "env",
        ]
    ),
    "steps": frozenset({"name", "agent", "verifier", "min_reward", "healthcheck", "artifacts"}),
}

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_UNIT_MB = {"": 1 / 2**20, "b": 1 / 2**20, "k": 1 / 1024, "m": 1.0, "g": 1024.0, "t": 2**20}


class StepConfig(BaseModel):
    """One ``[[steps]]`` entry: its folder name, its own timeouts and users (None: the
    task's), its verifier's env (over the task's), and ``min_reward``: below it (a number:
    the ``reward`` value; a table: each named value) the remaining steps are not run."""

    model_config = ConfigDict(frozen=True)

    name: str
    agent_timeout: float | None = None
    verifier_timeout: float | None = None
    agent_user: str | None = None
    verifier_user: str | None = None
    verifier_env: dict[str, str] = Field(default_factory=dict)
    min_reward: float | dict[str, float] | None = None


class HarborConfig(BaseModel):
    """What vfray takes from one ``task.toml``."""

    model_config = ConfigDict(frozen=True)

    schema_version: str = "1.0"
    name: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    agent_timeout: float = DEFAULT_AGENT_TIMEOUT
    verifier_timeout: float = DEFAULT_VERIFIER_TIMEOUT
    verifier_env: dict[str, str] = Field(default_factory=dict)
    verifier_user: str | None = None
    agent_user: str | None = None
    solution_env: dict[str, str] = Field(default_factory=dict)
    build_timeout: float | None = None
    cpus: float | None = None
    memory_mb: float | None = None
    storage_mb: float | None = None
    gpus: int = 0
    allow_internet: bool = True
    docker_image: str | None = None
    steps: tuple[StepConfig, ...] = ()
    reward_strategy: str = "mean"
    warnings: tuple[str, ...] = ()
    """Keys this reader does not know, and values it could not read (one line each)."""
    unhonoured: tuple[str, ...] = ()
    """Settings vfray reads but cannot honour (one line each)."""


def size_mb(value: object, where: str) -> float:
    """``2048`` (already MB), ``"2G"``, ``"512Mi"``, ``"1.5GB"`` as MB."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    found = _SIZE.match(str(value))
    if found is None:
        raise TasksetError(f"{where}: cannot read the size {value!r} (use e.g. '2G' or '512M')")
    unit = (found.group(2) or "").lower()[:1]
    return float(found.group(1)) * _UNIT_MB[unit]


def _table(raw: dict[str, Any], key: str, path: Path) -> dict[str, Any]:
    value = raw.get(key, {})
    if not isinstance(value, dict):
        raise TasksetError(f"{path}: [{key}] must be a table, got {type(value).__name__}")
    return value


def _unknown(section: str, table: dict[str, Any]) -> list[str]:
    known = _KNOWN[section]
    where = f"[{section}] " if section else ""
    return [f"unknown key {where}{key!r} ignored" for key in table if key not in known]


def _str_map(value: object, where: str) -> dict[str, str]:
    if not isinstance(value, dict):
        raise TasksetError(f"{where} must be a table of strings")
    return {str(k): str(v) for k, v in value.items()}


def _user(table: dict[str, Any]) -> str | None:
    return None if table.get("user") is None else str(table["user"])


def _step(step: dict[str, Any], path: Path, unhonoured: list[str]) -> StepConfig:
    """One ``[[steps]]`` table; what vfray does not run of it noted in ``unhonoured``."""
    where = f"{path}: step {step['name']!r}"
    s_agent, s_verifier = step.get("agent", {}), step.get("verifier", {})
    if not isinstance(s_agent, dict) or not isinstance(s_verifier, dict):
        raise TasksetError(f"{where}: its agent and verifier must be tables")
    for key in ("healthcheck", "artifacts"):
        if step.get(key):
            unhonoured.append(f"step {step['name']!r} {key}: not run by vfray")
    try:
        return StepConfig(
            name=step["name"],
            agent_timeout=s_agent.get("timeout_sec"),
            verifier_timeout=s_verifier.get("timeout_sec"),
            agent_user=_user(s_agent),
            verifier_user=_user(s_verifier),
            verifier_env=_str_map(s_verifier.get("env", {}), f"{where}: verifier env"),
            min_reward=step.get("min_reward"),
        )
    except (ValueError, TypeError) as exc:
        first = str(exc).splitlines()
        raise TasksetError(f"{where}: {' '.join(first[:3])}") from exc


def read_config(path: Path) -> HarborConfig:
    """Read ``path`` (a ``task.toml``). Raises :class:`TasksetError` in one line for a file
    that is not TOML or a value of the wrong kind."""
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise TasksetError(f"{path}: cannot read task.toml: {exc}") from exc
    warnings = _unknown("", raw)
    unhonoured: list[str] = []
    version = str(raw.get("schema_version", raw.get("version", "1.0")))
    if version not in SCHEMA_VERSIONS:
        warnings.append(f"schema version {version!r} is not one of {', '.join(SCHEMA_VERSIONS)}")
    task, agent = _table(raw, "task", path), _table(raw, "agent", path)
    verifier, env = _table(raw, "verifier", path), _table(raw, "environment", path)
    solution = _table(raw, "solution", path)
    for section, table in (("task", task), ("agent", agent), ("verifier", verifier),
                           ("environment", env), ("solution", solution)):  # fmt: skip
        warnings += _unknown(section, table)
    metadata = dict(_table(raw, "metadata", path))
    for key in ("description", "authors", "keywords"):
        if key in task:
            metadata.setdefault(key, task[key])
    for key in ("source",):
        if key in raw:
            metadata.setdefault(key, raw[key])
    memory = env.get("memory_mb", env.get("memory"))
    storage = env.get("storage_mb", env.get("storage"))
    gpus = int(env.get("gpus", 0) or 0)
    if env.get("gpu_types"):
        unhonoured.append(
            f"gpu_types {env['gpu_types']!r}: vfray asks Ray for {gpus} GPU(s) of any type"
        )
    if "build_timeout_sec" in env:
        unhonoured.append(
            f"build_timeout_sec {env['build_timeout_sec']}: the node's image store builds "
            "without a deadline"
        )
    if "env" in env:
        unhonoured.append("[environment] env: set it in the Dockerfile (ENV); vfray passes none")
    if verifier.get("environment_mode") == "separate" or "environment" in verifier:
        unhonoured.append(
            "[verifier] a separate verifier environment: vfray runs the verifier in the agent's box"
        )
    steps: list[StepConfig] = []
    raw_steps = raw.get("steps", [])
    if not isinstance(raw_steps, list):
        raise TasksetError(f"{path}: steps must be an array of tables ([[steps]])")
    for index, step in enumerate(raw_steps):
        if not isinstance(step, dict) or not isinstance(step.get("name"), str):
            raise TasksetError(f"{path}: [[steps]] entry {index} needs a name")
        warnings += _unknown("steps", step)
        steps.append(_step(step, path, unhonoured))
    strategy = str(raw.get("multi_step_reward_strategy", "mean"))
    if strategy not in ("mean", "final"):
        raise TasksetError(f"{path}: multi_step_reward_strategy must be 'mean' or 'final'")
    try:
        return HarborConfig(
            schema_version=version,
            name=task.get("name"),
            metadata=metadata,
            agent_timeout=float(agent.get("timeout_sec", DEFAULT_AGENT_TIMEOUT)),
            verifier_timeout=float(verifier.get("timeout_sec", DEFAULT_VERIFIER_TIMEOUT)),
            verifier_env=_str_map(verifier.get("env", {}), f"{path}: [verifier] env"),
            verifier_user=_user(verifier),
            agent_user=_user(agent),
            solution_env=_str_map(solution.get("env", {}), f"{path}: [solution] env"),
            build_timeout=env.get("build_timeout_sec"),
            cpus=env.get("cpus"),
            memory_mb=None if memory is None else size_mb(memory, f"{path}: memory"),
            storage_mb=None if storage is None else size_mb(storage, f"{path}: storage"),
            gpus=gpus,
            allow_internet=bool(env.get("allow_internet", True)),
            docker_image=env.get("docker_image"),
            steps=tuple(steps),
            reward_strategy=strategy,
            warnings=tuple(warnings),
            unhonoured=tuple(unhonoured),
        )
    except (ValueError, TypeError) as exc:
        first = str(exc).splitlines()
        raise TasksetError(f"{path}: {' '.join(first[:3])}") from exc
