"""Command-line options generated from the config tree: every leaf of :class:`EvalConfig`
becomes ``--dotted.name`` (kebab-case accepted), plus the short aliases people type most.
Keys under open sections (dict fields such as ``env.runtime.options``, and ``sampling``) are
accepted too: ``--env.runtime.options.image python:3.11``."""

from __future__ import annotations

import argparse
import difflib
import json
import typing
from typing import Any

from pydantic import BaseModel

from vfray.config import EvalConfig, iter_fields
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


def _parse_literal(raw: str) -> Any:
    """Values under open sections have no declared type: take JSON literals (numbers, true,
    null, lists, objects) as such and anything else as a string."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def add_config_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("configuration (any field of the config tree)")
    for dotted, _annotation, description in iter_fields(EvalConfig):
        if dotted in SKIP:
            continue
        names = [f"--{dotted}"]
        kebab = f"--{dotted.replace('_', '-')}"
        if kebab != names[0]:
            names.append(kebab)
        names = ALIASES.get(dotted, []) + names
        group.add_argument(
            *names,
            dest=PREFIX + dotted,
            metavar="VALUE",
            type=_parse_value,
            default=argparse.SUPPRESS,
            help=description or None,
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


def parse_free_overrides(extra: list[str]) -> dict[str, Any]:
    """Turn leftover ``--section.key VALUE`` (or ``--section.key=VALUE``) arguments into dotted
    overrides when the section is open; anything else is a usage error naming near matches."""
    sections = open_sections()
    known = [f"--{d}" for d, _, _ in iter_fields(EvalConfig) if d not in SKIP]
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
            near = difflib.get_close_matches(f"--{dotted}", known, n=3)
            hint = f" Did you mean: {', '.join(near)}?" if near else ""
            raise ConfigError(f"unknown option {token.split('=')[0]!r}.{hint}")
        if not sep:
            if not items or items[0].startswith("--"):
                raise ConfigError(f"option {token!r} needs a value")
            value = items.pop(0)
        overrides[dotted] = _parse_literal(value)
    return overrides
