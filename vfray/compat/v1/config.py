"""v1 eval configs on vfray: a v1 eval TOML (``[env.taskset]``, ``[env.agent.harness]``,
``[env.agent.runtime]``, ``[select]``, ``[client]`` ...) and the common ``vf-eval`` flags, mapped
onto vfray's config tree. Every option is either mapped, accepted as already true of vfray (said
in a note), or refused in one line naming it: nothing is dropped silently.

Internal: importable, but not the public API (:mod:`vfray`, :mod:`vfray.testing`,
:mod:`vfray.train`, :mod:`vfray.compat.v1`); names here may move."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vfray.errors import ConfigError

PREFIX = "v1:"
"""How a v1 taskset is named in vfray's config (``taskset = "v1:my-taskset"``)."""

HARNESSES = {
    "bash": "bash",
    "null": "null",
    "mini_swe_agent": "mini-swe-agent",
    "mini-swe-agent": "mini-swe-agent",
    "claude_code": "claude-code-acp",
    "claude-code": "claude-code-acp",
    "codex": "codex-acp",
    "kimi_code": "kimi-code",
    "openclaw": "openclaw",
    "hermes_agent": "hermes-agent",
    "pi": "pi",
    "terminus_2": "terminus-2",
    "compact": "compact",
    "rlm": "rlm",
    "browser_use": "browser-use",
}
"""v1 harness ids -> the vfray harness that plays the same part. v1's ``pool`` is Poolside's
own ACP agent (a GitHub-release binary), not vfray's ``pool`` of warm processes: not mapped.
v1's ``browser_use`` is a chat loop over the ``browser-harness`` package; vfray's
``browser-use`` runs the PyPI agent of that name, in the same part (a browser task)."""

RUNTIMES = {"subprocess": "subprocess", "docker": "docker", "modal": "modal"}

_SHORT = {
    "m": "model",
    "n": "select.limit",
    "r": "num_rollouts",
    "c": "max_concurrent",
    "s": "select.shuffle",
    "o": "output_dir",
    "v": "verbose",
}
_ALIASES = {
    "group_size": "num_rollouts",
    "rollouts_per_example": "num_rollouts",
    "num_examples": "select.limit",
    "batch_size": "select.limit",
    "num_tasks": "select.limit",
}
_BOOLS = {"select.shuffle", "verbose", "dry_run", "clean", "rich", "push", "resume"}
_DIRECT = {
    "model": "model.name",
    "num_rollouts": "rollouts_per_task",
    "max_concurrent": "max_concurrent",
    "output_dir": "output_dir",
    "select.limit": "num_tasks",
    "select.shuffle": "shuffle",
    "select.seed": "seed",
    "client.base_url": "model.base_url",
    "client.api_key_var": "model.api_key_var",
    "env.agent.model": "model.name",
    "env.agent.client.base_url": "model.base_url",
    "env.agent.client.api_key_var": "model.api_key_var",
    "env.agent.max_turns": "env.max_turns",
    "env.agent.max_input_tokens": "env.max_input_tokens",
    "env.agent.max_output_tokens": "env.max_output_tokens",
    "env.agent.max_total_tokens": "env.max_total_tokens",
    "env.agent.timeout.setup": "env.timeouts.setup",
    "env.agent.timeout.rollout": "env.timeouts.agent",
    "env.agent.timeout.finalize": "env.timeouts.finalize",
    "env.agent.timeout.scoring": "env.timeouts.scoring",
}
_V1_ROOTS = (
    "env.taskset",
    "env.agent",
    "env.id",
    "env.n",
    "env.threshold",
    "env.user",
    "env.assistant",
    "env.persona",
    "env.done_marker",
    "client",
    "select",
    "run",
    "num_rollouts",
    "group_size",
    "rollouts_per_example",
    "serve",
    "rich",
    "push",
    "clean",
    "resume",
    "env.timeout",
    "env.retries",
    "env.interception",
    "env.max_concurrent_agents",
)


_ENV_REFUSED = ("agent", "timeout", "retries", "interception", "max_concurrent_agents")
"""``env.<x>`` roots that are not an env's own fields (``env.agent.*`` is the run's agent)."""


@dataclass
class Mapped:
    """A v1 config as vfray overrides, the v1-only run flags, and what was said about it."""

    overrides: dict[str, Any] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)
    """One per v1 option: ``v1 option = value -> vfray key = value`` or a note."""
    dry_run: bool = False
    verbose: bool = False
    no_progress: bool = False


def is_v1_token(token: str) -> bool:
    """Whether a leftover command-line token is a v1 flag."""
    if token in ("-s", "-v"):
        return True
    name = token.lstrip("-").split("=", 1)[0].replace("-", "_")
    name = name[3:] if name.startswith("no_") else name
    if not token.startswith("--"):
        return False
    if any(name == r or name.startswith(r + ".") for r in _V1_ROOTS):
        return True
    # An env's own field (``--env.attempts``, ``--env.player0.runtime.type``), as a TOML's
    # ``[env]`` table gives it: any ``env.<x>`` that is not one of vfray's own env settings.
    root = name.split(".")
    return len(root) > 1 and root[0] == "env" and root[1] not in _vfray_env_fields()


@functools.cache
def _vfray_env_fields() -> frozenset[str]:
    from vfray.config import EnvConfig

    return frozenset(EnvConfig.model_fields)


def is_v1_toml(data: Mapping[str, Any]) -> bool:
    env = data.get("env")
    nested = isinstance(env, Mapping) and bool({"taskset", "agent", "id"} & set(env))
    return nested or bool({"num_rollouts", "client", "select", "group_size"} & set(data))


def parse_flags(tokens: Sequence[str]) -> dict[str, Any]:
    """v1-style flags (``--a.b-c V``, ``--a.b=V``, ``--flag`` / ``--no-flag``, ``-s``) as dotted
    keys, in v1's own names (aliases folded)."""
    from vfray.config import parse_literal

    out: dict[str, Any] = {}
    items = list(tokens)
    while items:
        token = items.pop(0)
        if token.startswith("--"):
            name, sep, value = token[2:].partition("=")
        elif len(token) == 2 and token[0] == "-" and token[1] in _SHORT:
            name, sep, value = token[1], "", ""
        else:
            raise ConfigError(f"unexpected argument {token!r}")
        dotted = name.replace("-", "_")
        dotted = _ALIASES.get(_SHORT.get(dotted, dotted), _SHORT.get(dotted, dotted))
        negated = dotted.startswith("no_") or ".no_" in dotted
        if negated:
            dotted = dotted.replace("no_", "", 1)
        if dotted in _BOOLS or negated:
            if not sep and items and items[0].lower() in ("true", "false"):
                value, sep = items.pop(0), "="
            flag = True if not sep else str(value).lower() == "true"
            out[dotted] = not flag if negated else flag
            continue
        if not sep:
            if not items:
                raise ConfigError(f"v1 option {token!r} needs a value")
            value = items.pop(0)
        # Ids and types are names: "null" is the null harness, not None.
        out[dotted] = value if dotted.endswith((".id", ".type")) else parse_literal(value)
    return out


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested TOML table as dotted keys (v1's aliases folded)."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}".replace("-", "_")
        if isinstance(value, Mapping):
            out.update(flatten(value, dotted + "."))
        else:
            out[_ALIASES.get(dotted, dotted)] = value
    return out


def translate(options: Mapping[str, Any], taskset: str | None = None) -> Mapped:
    """Map dotted v1 options onto vfray; raise :class:`ConfigError` naming every refused one."""
    mapped = Mapped()
    refused: list[str] = []
    taskset_config: dict[str, Any] = {}
    select: dict[str, Any] = {}
    env_args: dict[str, Any] = {}
    env_id: str | None = None
    harness: str | None = None
    over = mapped.overrides

    def note(key: str, value: Any, target: str) -> None:
        mapped.lines.append(f"v1 {key} = {value!r} -> {target}")

    for key, value in options.items():
        if key in _DIRECT:
            over[_DIRECT[key]] = value
            note(key, value, f"{_DIRECT[key]} = {value!r}")
        elif key == "env.taskset.id":
            taskset = str(value)
        elif key.startswith("env.taskset."):
            _set(taskset_config, key[len("env.taskset.") :], value)
            note(key, value, f"taskset_args.config.{key[len('env.taskset.') :]}")
        elif key.startswith("select.") and key[len("select.") :].split(".")[0] in (
            "include",
            "exclude",
            "skip",
        ):
            _set(select, key[len("select.") :], value)
            note(key, value, f"taskset_args.select.{key[len('select.') :]}")
        elif key.startswith("sampling.") or key.startswith("env.agent.sampling."):
            leaf = key.rsplit("sampling.", 1)[1]
            over[f"sampling.{leaf}"] = value
            note(key, value, f"sampling.{leaf} = {value!r}")
        elif key == "env.agent.harness.id":
            if str(value) not in HARNESSES:
                refused.append(
                    f"{key}={value} (vfray harnesses for v1 ids: {', '.join(sorted(HARNESSES))})"
                )
            else:
                over["env.harness.id"] = HARNESSES[str(value)]
                harness = HARNESSES[str(value)]  # chosen: a package's own Harness is not needed
                note(key, value, f"env.harness.id = {HARNESSES[str(value)]!r}")
        elif key == "env.agent.runtime.type":
            if str(value) not in RUNTIMES:
                refused.append(f"{key}={value} (vfray runs subprocess, docker, modal; also bwrap)")
            else:
                over["env.runtime.type"] = RUNTIMES[str(value)]
                note(key, value, f"env.runtime.type = {RUNTIMES[str(value)]!r}")
        elif key == "env.id":
            env_id = str(value)
            note(key, value, "the run's env")
        elif key in ("env.n", "env.threshold"):
            env_args[key[4:]] = value
            note(key, value, f"env {key[4:]}")
        elif key.startswith("env.") and key.split(".")[1] not in _ENV_REFUSED:
            # An env's own fields (user-sim's seats ``env.user.*``, ``env.persona``, a package
            # env's seats): validated against that env's config when it is built.
            _set(env_args, key[len("env.") :], value)
            note(key, value, f"env {key[len('env.') :]}")
        elif key in ("client.type",) and value == "eval":
            note(key, value, "(vfray's client relays the eval model)")
        elif key == "dry_run":
            mapped.dry_run = bool(value)
        elif key == "verbose":
            mapped.verbose = bool(value)
        elif key == "rich":
            mapped.no_progress = not value
            note(key, value, "live progress " + ("on" if value else "off"))
        elif key == "push" and not value:
            note(key, value, "(vfray uploads nothing)")
        elif key == "clean" and value:
            note(key, value, "(vfray writes every run to a new folder)")
        elif key == "resume" and not value:
            continue
        elif key == "resume":
            refused.append("--resume (use: vfray resume RUN_DIR, the folder the run printed)")
        else:
            refused.append(f"{key}={value!r}")
    if refused:
        raise ConfigError("v1 options not supported by vfray: " + "; ".join(refused))
    if env_id in ("best-of-n", "best_of_n"):
        if over.get("rollouts_per_task", 1) != 1:
            raise ConfigError(
                "v1 options not supported by vfray: num_rollouts > 1 with env.id best-of-n"
            )
        over["rollouts_per_task"] = int(env_args.get("n", 4))
        mapped.lines.append(
            f"v1 env best-of-n n={over['rollouts_per_task']} -> rollouts_per_task (one group)"
        )
    if select:
        # v1 applies include/exclude/shuffle/skip/limit in one fixed order: keep them together.
        for key, target in (("shuffle", "shuffle"), ("seed", "seed"), ("limit", "num_tasks")):
            if target in over:
                select[key] = over.pop(target)
    args: dict[str, Any] = {}
    if taskset_config:
        args["config"] = taskset_config
    if select:
        args["select"] = select
    if env_id or env_args:
        args["env"] = {"id": env_id, **env_args}
    if harness:
        args["harness"] = harness
    if args:
        over["taskset_args"] = args
    if taskset is not None:
        over["taskset"] = taskset if taskset.startswith(PREFIX) else PREFIX + taskset
    if "env.runtime.type" not in over:
        mapped.lines.append(
            "v1's default runtime (prime) is not available: vfray's default (subprocess) runs it"
        )
    return mapped


def _set(tree: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    for part in parts[:-1]:
        tree = tree.setdefault(part, {})
    tree[parts[-1]] = value


def v1_tokens(extra: Iterable[str]) -> tuple[list[str], list[str]]:
    """Split leftover tokens into v1 flags (with their values) and the rest."""
    v1: list[str] = []
    rest: list[str] = []
    items = list(extra)
    while items:
        token = items.pop(0)
        target = v1 if is_v1_token(token) else rest
        target.append(token)
        takes_value = token.startswith("--") and "=" not in token
        name = token.lstrip("-").replace("-", "_")
        is_bool = (
            token in ("-s", "-v")
            or name.startswith("no_")
            or name in _BOOLS
            or name in ("shuffle",)
        )
        if takes_value and not is_bool and items and not items[0].startswith("-"):
            target.append(items.pop(0))
        elif is_bool and "=" not in token and items and items[0].lower() in ("true", "false"):
            # parse_flags reads ``--select.shuffle true``: the value stays with its flag (it
            # used to be left over, an "unexpected argument 'true'").
            target.append(items.pop(0))
    return v1, rest
