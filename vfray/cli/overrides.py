"""Command-line options generated from the config tree: every leaf of :class:`EvalConfig`
becomes ``--dotted.name`` (kebab-case accepted), plus the short aliases people type most."""

from __future__ import annotations

import argparse
import json
from typing import Any

from vfray.config import EvalConfig, iter_fields

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
