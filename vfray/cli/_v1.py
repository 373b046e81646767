"""How ``vfray eval`` recognises a verifiers v1 eval (a v1 taskset id or path, a v1 eval TOML,
``vf-eval`` flags) and maps it with :mod:`vfray.compat.v1.config`."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vfray.errors import ConfigError

_V1_HINTS = (
    "--env.taskset",
    "--env.agent",
    "--env.id",
    "--client.",
    "--select.",
    "--num-rollouts",
    "--num_rollouts",
    "--no-push",
    "--no-rich",
    "--resume",
    "--run.",
    "--push",
    "--rich",
    "--clean",
    "--group-size",
    "--rollouts-per-example",
)


@dataclass
class V1Eval:
    """A v1 eval mapped: vfray overrides, the tokens left for vfray, and the mapping lines."""

    overrides: dict[str, Any]
    rest: list[str]
    lines: list[str]
    toml: str | None = None
    dry_run: bool = False
    verbose: bool = False
    no_progress: bool = False
    notes: list[str] = field(default_factory=list)


def _toml(item: str) -> dict[str, Any] | None:
    if not item.startswith("@"):
        return None
    try:
        return tomllib.loads(Path(item[1:]).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None  # vfray's loader reports it


def might_be_v1(positional: list[str], extra: list[str]) -> bool:
    """Cheap: no import of the v1 layer unless something hints at v1."""
    if any(t in ("-s", "-v") or t.startswith(_V1_HINTS) for t in extra):
        return True
    for item in positional:
        data = _toml(item)
        if data is not None:
            env = data.get("env")
            if (isinstance(env, dict) and {"taskset", "agent", "id"} & set(env)) or {
                "num_rollouts",
                "client",
                "select",
                "group_size",
            } & set(data):
                return True
        elif not item.startswith("@") and _not_vfray_taskset(item):
            return True
    return False


def _not_vfray_taskset(spec: str) -> bool:
    if spec.startswith("v1:"):
        return True
    if ":" in spec:
        return False
    from vfray.tasksets import known_tasksets

    return spec not in known_tasksets()


def map_v1_eval(positional: list[str], extra: list[str]) -> V1Eval | None:
    from vfray.compat.v1 import config as v1c
    from vfray.compat.v1.loader import LEGACY_HARNESS, is_legacy_spec, looks_like_v1_package

    options: dict[str, Any] = {}
    toml: str | None = None
    taskset: str | None = None
    for item in positional:
        data = _toml(item)
        if data is not None and v1c.is_v1_toml(data):
            options.update(v1c.flatten(data))
        elif item.startswith("@"):
            toml = item[1:]
        elif item.startswith("v1:") or looks_like_v1_package(item):
            taskset = item
        else:
            if taskset is not None:
                raise ConfigError(f"taskset given twice: {taskset!r} and {item!r}")
            if options or _has_v1(extra):
                raise ConfigError(f"v1 options given with {item!r}, which is not a v1 taskset")
            return None
    v1_flags, rest = v1c.v1_tokens(extra)
    options.update(v1c.parse_flags(v1_flags))
    if not options and taskset is None:
        return None
    mapped = v1c.translate(options, taskset)
    if "taskset" not in mapped.overrides:
        raise ConfigError("a v1 eval needs its taskset: positional id/path or env.taskset.id")
    if "env.harness.id" not in mapped.overrides and is_legacy_spec(mapped.overrides["taskset"]):
        # A classic env runs its own rollout loop: the legacy harness is the only one it has.
        mapped.overrides["env.harness.id"] = LEGACY_HARNESS
        mapped.lines.append(f"classic verifiers env -> env.harness.id = {LEGACY_HARNESS!r}")
    return V1Eval(
        mapped.overrides,
        rest,
        mapped.lines,
        toml,
        mapped.dry_run,
        mapped.verbose,
        mapped.no_progress,
    )


def _has_v1(extra: list[str]) -> bool:
    return any(t in ("-s", "-v") or t.startswith(_V1_HINTS) for t in extra)
