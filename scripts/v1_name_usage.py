"""Counts how many v1 environments use each ``verifiers.v1`` name, and whether vfray serves it.

Usage: ``python scripts/v1_name_usage.py DIR [DIR ...]``: each DIR holds environments, one
folder each (verifiers' repo's ``environments/``); a name counts once per environment, whether
it is reached as ``vf.Name`` (after ``import verifiers.v1 as vf``) or imported by name from
``verifiers.v1`` or one of its submodules. Prints a markdown table, most used first (the table
in docs/guides/v1.md comes from this).
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path


def names_in(source: str) -> set[str]:
    """The ``verifiers.v1`` names one module uses (``module:name`` for a submodule's)."""
    tree = ast.parse(source)
    aliases: dict[str, str] = {}  # local alias -> module it stands for
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("verifiers.v1") and a.asname:
                    aliases[a.asname] = a.name
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("verifiers.v1"):
            module = node.module or ""
            for a in node.names:
                found.add(a.name if module == "verifiers.v1" else f"{module}:{a.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            module = aliases.get(node.value.id)
            if module is not None:
                found.add(node.attr if module == "verifiers.v1" else f"{module}:{node.attr}")
    return found


def main(dirs: list[str]) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import vfray.compat.v1 as layer
    from vfray.compat.v1._surface import SUBMODULES

    counts: Counter[str] = Counter()
    users: dict[str, list[str]] = {}
    for root in map(Path, dirs):
        for env in sorted(p for p in root.iterdir() if p.is_dir()):
            used: set[str] = set()
            for path in env.rglob("*.py"):
                used |= names_in(path.read_text(encoding="utf-8", errors="replace"))
            for name in used:
                counts[name] += 1
                users.setdefault(name, []).append(env.name)

    def served(name: str) -> str:
        module, _, attr = name.rpartition(":")
        if not module:
            return "yes" if name in layer.__all__ else "no"
        return "yes" if attr in SUBMODULES.get(module, ()) else "no"

    print("| name | environments | served | used by |")
    print("|---|---|---|---|")
    for name, count in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"| `{name}` | {count} | {served(name)} | {', '.join(sorted(users[name]))} |")


if __name__ == "__main__":
    main(sys.argv[1:])
