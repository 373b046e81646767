"""Command-line options generated from the config tree: every leaf of :class:`EvalConfig`
becomes ``--dotted.name`` (kebab-case accepted), plus the short aliases people type most.
Keys under open sections (dict fields such as ``env.runtime.options``, and ``sampling``) are
accepted too: ``--env.runtime.options.image python:3.11``."""

from __future__ import annotations

import argparse
import json
import typing
from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import BaseModel

from vfray.config import EvalConfig, iter_fields, parse_literal
from vfray.errors import ConfigError

ALIASES: dict[str, list[str]] = {
    "num_tasks": ["-n"],
    "rollouts_per_task": ["-r"],
    "max_concurrent": ["-c"],
    "model.name": ["-m", "--model"],
    "model.base_url": ["--base-url"],
    "model.api_key_var": ["--api-key-var"],
    "env.harness.id": ["--harness"],
    "env.runtime.type": ["--runtime"],
    "output_dir": ["-o"],
    "address": ["--address"],
}
PREFIX = "cfg:"
SKIP = {"taskset"}  # positional
BOOL_WORDS = frozenset({"true", "false", "yes", "no", "on", "off", "1", "0"})
"""Values a boolean flag takes as its next argument; anything else is not its value."""


def _parse_value(raw: str) -> Any:
    """JSON when it parses as an object or list (dict-typed fields), else the raw string:
    pydantic converts "8" to 8 and "true" to True against the field's type."""
    text = raw.strip()
    if text.startswith(("{", "[")):
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return raw
    return raw


def bool_options() -> set[str]:
    """The option strings of boolean leaves (``--shuffle``): they work as bare flags."""
    found: set[str] = set()
    for dotted, annotation, _ in iter_fields(EvalConfig):
        if annotation is bool and dotted not in SKIP:
            found |= {f"--{dotted}", f"--{dotted.replace('_', '-')}", *ALIASES.get(dotted, [])}
    return found


def normalize_bool_flags(argv: Sequence[str]) -> list[str]:
    """``--shuffle`` alone means ``--shuffle=true``; ``--shuffle false`` still works. Done
    before argparse, because an optional value would swallow the positional after a flag
    (``--shuffle arithmetic``)."""
    flags = bool_options()
    out: list[str] = []
    items = list(argv)
    while items:
        token = items.pop(0)
        if token == "--":
            out += [token, *items]
            break
        if token in flags:
            if items and items[0].lower() in BOOL_WORDS:
                token = f"{token}={items.pop(0)}"
            else:
                token = f"{token}=true"
        out.append(token)
    return out


def add_config_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("configuration (any field of the config tree)")
    for dotted, annotation, description in iter_fields(EvalConfig):
        if dotted in SKIP:
            continue
        names = [f"--{dotted}"]
        kebab = f"--{dotted.replace('_', '-')}"
        if kebab != names[0]:
            names.append(kebab)
        names = ALIASES.get(dotted, []) + names
        is_bool = annotation is bool
        group.add_argument(
            *names,
            dest=PREFIX + dotted,
            metavar="true|false" if is_bool else "VALUE",
            type=_parse_value,
            default=argparse.SUPPRESS,
            help=(description or "") + (f" ({kebab} alone means true)" if is_bool else "") or None,
        )
        if is_bool:
            leaf = dotted.rsplit(".", 1)[-1].replace("_", "-")
            prefix = dotted.rsplit(".", 1)[0] + "." if "." in dotted else ""
            group.add_argument(
                f"--{prefix}no-{leaf}",
                dest=PREFIX + dotted,
                action="store_const",
                const=False,
                default=argparse.SUPPRESS,
                help=f"same as {kebab} false",
            )


def collect_overrides(args: argparse.Namespace) -> dict[str, Any]:
    return {k[len(PREFIX) :]: v for k, v in vars(args).items() if k.startswith(PREFIX)}


def open_sections(model: type[BaseModel] = EvalConfig, prefix: str = "") -> list[str]:
    """Dotted names under which any key is valid: dict-typed fields, and models that allow
    extra keys (``sampling`` passes unknown parameters through to the endpoint)."""
    found = [prefix.rstrip(".")] if prefix and model.model_config.get("extra") == "allow" else []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            found += open_sections(annotation, f"{prefix}{name}.")
        elif typing.get_origin(annotation) is dict:
            found.append(f"{prefix}{name}")
    return found


def _distance(a: str, b: str) -> int:
    """Levenshtein distance (insertions, deletions, substitutions)."""
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def near_options(token: str, known: Iterable[str], n: int = 3) -> list[str]:
    """The options a mistyped ``token`` most likely meant: ones it is a prefix of (``--harn``),
    then the fewest edits away (``--harnes`` -> ``--harness``, not ``--address``)."""
    name = token.split("=", 1)[0]
    folded = name.replace("_", "-")
    scored: list[tuple[int, int, str]] = []
    for option in dict.fromkeys(known):
        if not option.startswith("--"):
            continue
        target = option.replace("_", "-")
        if len(folded) > 3 and target.startswith(folded):
            scored.append((0, _distance(name, option), option))
            continue
        edits = min(_distance(name, option), _distance(folded, target) + 1)
        if edits <= max(2, len(name) // 4):
            scored.append((1, edits, option))
    scored.sort()
    picked: list[str] = []
    for _, _, option in scored:
        # --env.max_turns and --env.max-turns are one option: name it once.
        if all(option.replace("_", "-") != p.replace("_", "-") for p in picked):
            picked.append(option)
    return picked[:n]


def config_option_names() -> list[str]:
    """Every option string the config tree gives ``vfray eval``."""
    names: list[str] = []
    for dotted, _, _ in iter_fields(EvalConfig):
        if dotted not in SKIP:
            names += [*ALIASES.get(dotted, []), f"--{dotted}", f"--{dotted.replace('_', '-')}"]
    return names


def parse_free_overrides(extra: list[str], known: Sequence[str] = ()) -> dict[str, Any]:
    """Turn leftover ``--section.key VALUE`` (or ``--section.key=VALUE``) arguments into dotted
    overrides when the section is open; anything else is a usage error naming near matches
    among ``known`` (the command's own options) and every config option."""
    sections = open_sections()
    candidates = [*known, *config_option_names()]
    overrides: dict[str, Any] = {}
    items = list(extra)
    while items:
        token = items.pop(0)
        if not token.startswith("--") or len(token) == 2:
            raise ConfigError(f"unexpected argument {token!r}")
        name, sep, value = token[2:].partition("=")
        dotted = name.replace("-", "_")
        section = next((s for s in sections if dotted.startswith(s + ".")), None)
        if section is None:
            near = near_options(f"--{name}", candidates)
            hint = f" Did you mean: {', '.join(near)}?" if near else ""
            raise ConfigError(f"unknown option {token.split('=')[0]!r}.{hint}")
        if not sep:
            if not items or items[0].startswith("--"):
                raise ConfigError(f"option {token!r} needs a value")
            value = items.pop(0)
        overrides[dotted] = parse_literal(value)
    return overrides
