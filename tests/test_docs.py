"""The README and the docs site (docs/, mkdocs.yml) say what the code does: the README stays a
front page whose first two commands are the ones .ci/run runs, its links resolve, and the pages
generated from the code (the command line, the harness flags) match it. ``mkdocs build
--strict`` (in .ci/run) checks the site's own links and API pages."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
import yaml

from vfray.cli.main import SUBCOMMANDS, build_parser
from vfray.harnesses.registry import available_harnesses, harness_class

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
README = REPO / "README.md"

QUICK_START = "pip install -e . && vfray eval arithmetic -n 20 -r 4 --harness null"
DEV_TEST = 'pip install -e ".[dev]" && python -m pytest -n 2 --dist loadfile'


def test_readme_is_a_front_page() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 200, f"README has {len(lines)} lines: move the detail into docs/"
    commands = re.findall(r"```bash\n(.*?)\n```", README.read_text(), flags=re.S)
    assert commands[:2] == [QUICK_START, DEV_TEST]
    ci = (REPO / ".ci" / "run").read_text()
    # .ci/run runs the same two steps (the install and the eval, then the dev install).
    assert "python -m pip install -q -e .\n" in ci
    assert "vfray eval arithmetic -n 20 -r 4 --harness null" in ci
    assert 'python -m pip install -q -e ".[dev]"' in ci


def test_readme_links_resolve() -> None:
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README.read_text()):
        if "://" in target:
            continue
        assert (REPO / target).exists(), f"README links to a missing {target}"


def test_no_design_md_reference() -> None:
    """DESIGN.md is not in the repository: its design is docs/architecture.md."""
    for page in [README, *DOCS.rglob("*.md")]:
        assert "DESIGN.md" not in page.read_text(), page


def nav_pages(node: object) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [p for value in node.values() for p in nav_pages(value)]
    if isinstance(node, list):
        return [p for item in node for p in nav_pages(item)]
    return []


def test_every_page_is_in_the_nav() -> None:
    # mkdocs' own loader: mkdocs.yml names a Python function for the mermaid fence.
    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("tag:yaml.org,2002:python/name:", lambda *_: None)
    config = yaml.load((REPO / "mkdocs.yml").read_text(), Loader=Loader)
    in_nav = set(nav_pages(config["nav"]))
    on_disk = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert in_nav == on_disk


def test_cli_page_lists_every_subcommand_and_option() -> None:
    page = (DOCS / "reference" / "cli.md").read_text()
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {choice.dest: choice.help for choice in sub._choices_actions}
    for name in SUBCOMMANDS:
        assert f"## vfray {name}\n" in page
        assert f"| [`vfray {name}`](#vfray-{name}) | {helps[name]} |" in page
        if name == "eval":  # its flags are the config tree's: the configuration reference
            options = ["--dry-run", "--no-progress", "--no-preflight"]
        else:
            options = [s for a in sub.choices[name]._actions for s in a.option_strings]
        for option in options:
            assert option in page, f"vfray {name} {option} is missing from reference/cli.md"


FLAGS = ("APPENDS_SYSTEM_PROMPT", "SUPPORTS_MCP", "SUPPORTS_RESUME", "EXECUTES_CODE")


@pytest.mark.parametrize("harness_id", available_harnesses())
def test_agents_page_flags_match_the_harnesses(harness_id: str) -> None:
    cls = harness_class(harness_id)
    page = (DOCS / "agents" / "index.md").read_text()
    row = next(line for line in page.splitlines() if line.startswith(f"| `{harness_id}`"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2:] == ["yes" if getattr(cls, flag) else "no" for flag in FLAGS]


def test_reward_curve_copy_is_the_examples() -> None:
    """The site cannot link outside docs/, so it shows a copy of the example's plot."""
    copy = (DOCS / "img" / "reward_curve.png").read_bytes()
    assert copy == (REPO / "examples" / "rl" / "reward_curve.png").read_bytes()


def test_architecture_page_shows_the_layers_contract() -> None:
    """The layers table is the import-linter contract that CI checks, in its order."""
    import tomllib

    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c for c in contracts["contracts"] if c["type"] == "layers")["layers"]
    page = (DOCS / "architecture.md").read_text()
    shown = re.findall(r"^\| \d+ \| `(.*)` \|$", page, flags=re.M)
    assert [s.replace("\\|", "|") for s in shown] == layers
