"""Print the configuration reference as a Markdown table, generated from the config tree
(``vfray.config.EvalConfig`` via ``iter_fields``), so the docs' configuration reference
(docs/reference/configuration.md) never drifts from the code."""

from __future__ import annotations

import json
import types
import typing
from typing import Any

from vfray.cli.overrides import ALIASES, open_sections
from vfray.config import EvalConfig, iter_fields


def type_name(annotation: Any) -> str:
    """``int | None`` rather than ``typing.Optional[int]``: the spelling users write."""
    if annotation is None or annotation is type(None):
        return "None"
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return " | ".join(json.dumps(a) for a in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in typing.get_args(annotation))
    if origin is not None:
        args = ", ".join(type_name(a) for a in typing.get_args(annotation))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    if annotation is Any:
        return "Any"
    return getattr(annotation, "__name__", str(annotation))


def default_of(dotted: str) -> Any:
    # model_construct fills defaults without reading VFRAY_* variables from this shell.
    node: Any = EvalConfig.model_construct()
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def reference() -> str:
    lines = [
        "| key | type | default | flag | environment variable | description |",
        "|---|---|---|---|---|---|",
    ]
    for dotted, annotation, description in iter_fields(EvalConfig):
        default = json.dumps(default_of(dotted))
        kebab = f"--{dotted.replace('_', '-')}"
        flags = list(dict.fromkeys([*ALIASES.get(dotted, []), kebab]))
        if annotation is bool:
            flags.append(f"--no-{dotted.replace('_', '-')}")
        if dotted == "taskset":
            flags = ["TASKSET (positional)"]
        env = "VFRAY_" + dotted.upper().replace(".", "__")
        lines.append(
            f"| `{dotted}` | `{cell(type_name(annotation))}` | `{cell(default)}` | "
            f"{', '.join(f'`{f}`' for f in flags)} | `{env}` | {cell(description)} |"
        )
    sections = ", ".join(f"`{s}`" for s in open_sections())
    lines += [
        "",
        f"Open sections accept any key: {sections} "
        "(e.g. `--env.runtime.options.default_image python:3.11-slim`).",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(reference())
