"""``vfray init NAME``: scaffold a taskset package — pyproject with a ``vfray.tasksets`` entry
point, a TaskData subclass, a Task with a reward, a Taskset, and a test that passes as is."""

from __future__ import annotations

import argparse
import keyword
import re
from pathlib import Path
from typing import Any

from vfray.errors import ConfigError

PYPROJECT = """\
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "{dist}"
version = "0.1.0"
description = "A vfray taskset: {name}"
requires-python = ">=3.11"
# vfray itself is not listed: it is not on the package index. Install it first, from its
# source tree or a wheel (pip install -e /path/to/vfray), into the same environment.
dependencies = []

[project.entry-points."vfray.tasksets"]
{name} = "{package}.taskset:{cls}Taskset"

[tool.setuptools]
packages = ["{package}"]

[tool.pytest.ini_options]
testpaths = ["tests"]
pythonpath = ["."]
"""

TASKSET = '''\
"""The {name} taskset: each task asks the model to repeat a word; the reward checks it did.

Replace the data fields, the prompt and the reward with your own; keep keys unique.
"""

from __future__ import annotations

from collections.abc import Iterator

import vfray as vf

WORDS = ["apple", "river", "candle", "orbit", "meadow", "lantern", "copper", "harbor"]


class {cls}Data(vf.TaskData):
    """One task as data: everything a rollout needs, JSON-serializable."""

    word: str


class {cls}Task(vf.Task[{cls}Data]):
    @vf.reward
    def said_the_word(self, trace: vf.Trace) -> bool:
        return self.data.word in (trace.last_reply or "").lower()

    @vf.metric
    def reply_chars(self, trace: vf.Trace) -> int:
        return len(trace.last_reply or "")


class {cls}Taskset(vf.Taskset[{cls}Task]):
    """``num_tasks`` repeat-the-word tasks."""

    name = "{name}"

    def __init__(self, num_tasks: int = len(WORDS)) -> None:
        self.num_tasks = num_tasks

    def load(self) -> Iterator[{cls}Task]:
        for index in range(self.num_tasks):
            word = WORDS[index % len(WORDS)]
            data = {cls}Data(prompt=f"Please repeat this word: {{word}}", word=word)
            yield {cls}Task(data, key=f"{{index}}:{{word}}")
'''

TEST = '''\
"""Tests for the {name} taskset: runnable with ``pytest`` in this folder, no network, no Ray."""

from __future__ import annotations

import asyncio

import vfray as vf
from {package}.taskset import {cls}Data, {cls}Taskset


def test_keys_are_unique_and_data_round_trips() -> None:
    tasks = {cls}Taskset().tasks()
    assert tasks
    assert len({{t.key for t in tasks}}) == len(tasks)
    for task in tasks:
        assert {cls}Data.model_validate_json(task.data.model_dump_json()) == task.data


def test_a_rollout_is_scored() -> None:
    task = next(iter({cls}Taskset(num_tasks=1)))
    # The built-in scripted "echo" model repeats the prompt, so the word is always said.
    trace = asyncio.run(vf.run_rollout(task, model="scripted:echo", harness="null"))
    assert trace.ok, trace.errors
    assert trace.reward == 1.0
'''

README = """\
# {name}

A taskset for vfray (agentic LLM rollouts on Ray).

```bash
pip install -e .          # registers the `{name}` taskset (vfray must be installed already)
vfray validate {name}     # keys, serialization, Task.validate in a runtime
{eval_command}
pip install pytest && pytest   # runs tests/test_taskset.py (vfray's install has no pytest)
```

`scripted:echo` is vfray's built-in stand-in model that repeats the prompt, so every task
scores 1.0; for a real model use `-m NAME --base-url http://host:8000/v1`.
"""

EVAL_ARGS = "-n 4 -r 2 --harness null -m scripted:echo"
"""The suggested first eval: the echo model says the word, so the scaffold scores 1.0."""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "init", allow_abbrev=False, help="scaffold a taskset package with a passing test"
    )
    parser.add_argument("name", help="taskset name, e.g. my_taskset")
    parser.add_argument("--dir", default=".", help="parent folder (default: current folder)")
    parser.set_defaults(run=run)
    return parser


def names(name: str) -> dict[str, str]:
    """The spellings a scaffold needs: entry-point name, package, distribution, class stem."""
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", name):
        raise ConfigError(
            f"bad taskset name {name!r}: use letters, digits, '_' or '-', starting with a letter"
        )
    package = name.replace("-", "_").lower()
    if keyword.iskeyword(package):
        raise ConfigError(f"bad taskset name {name!r}: {package!r} is a Python keyword")
    cls = "".join(part.capitalize() for part in re.split(r"[_-]+", package) if part)
    return {"name": name, "package": package, "dist": package.replace("_", "-"), "cls": cls}


def scaffold(name: str, parent: str | Path = ".") -> Path:
    """Write the package into ``parent/name`` (which must not exist or be empty)."""
    spell = names(name)
    spell["eval_command"] = f"vfray eval {name} {EVAL_ARGS}"
    root = Path(parent) / name
    if root.exists() and any(root.iterdir()):
        raise ConfigError(f"{root} exists and is not empty")
    files = {
        "pyproject.toml": PYPROJECT,
        "README.md": README,
        f"{spell['package']}/__init__.py": '"""The {name} taskset for vfray."""\n',
        f"{spell['package']}/taskset.py": TASKSET,
        "tests/test_taskset.py": TEST,
    }
    for relative, template in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(template.format(**spell))
    return root


def run(args: argparse.Namespace) -> int:
    root = scaffold(args.name, args.dir)
    print(f"created {root.absolute()}")
    # Every command works in the quick start's venv, which has vfray but no pytest.
    print(f"next: cd {root} && pip install -e . && vfray validate {args.name}")
    print(f"then: vfray eval {args.name} {EVAL_ARGS}")
    print("tests: pip install pytest && pytest   (tests/test_taskset.py)")
    return 0
