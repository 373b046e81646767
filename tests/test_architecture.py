"""The house: the layers hold (import-linter's contracts in pyproject.toml), no import cycle exists
even counting lazy and ``TYPE_CHECKING`` imports, the public surface is four modules with an
``__all__`` each, and everything else says it is internal."""

from __future__ import annotations

import ast
import importlib
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

PUBLIC = {
    "vfray.testing": [
        "ReceivedRequest",
        "ScriptedModel",
        "check_runtime",
        "scripted_server",
        "serve_in_loop",
        "serve_in_thread",
    ],
    "vfray.train": [
        "Batch",
        "BatchStats",
        "build_batch",
        "group_samples",
        "iter_batches",
        "read_samples",
        "stream_batches",
    ],
    "vfray.compat.v1": [
        "ID",
        "AdaptedTask",
        "AdaptedTaskset",
        "AgentConfig",
        "Agents",
        "Artifact",
        "AssistantMessage",
        "BestOfNEnv",
        "BestOfNEnvConfig",
        "ContentPart",
        "DecoratedFunctionConfig",
        "Env",
        "EnvConfig",
        "EnvError",
        "Episode",
        "Harness",
        "HarnessConfig",
        "HarnessError",
        "ImageUrlContentPart",
        "ImageUrlSource",
        "InterceptionError",
        "Judge",
        "JudgeConfig",
        "JudgeResponse",
        "JudgeView",
        "Judges",
        "Message",
        "MessageContent",
        "Messages",
        "ProgramResult",
        "ProviderError",
        "ReferenceJudge",
        "ReferenceJudgeConfig",
        "Request",
        "Response",
        "Reward",
        "RewardFunctionConfig",
        "RolloutError",
        "Runtime",
        "SandboxError",
        "SelectConfig",
        "SharedToolsetConfig",
        "SingleAgentEnv",
        "SingleAgentEnvConfig",
        "State",
        "StateT",
        "SystemMessage",
        "Task",
        "TaskConfig",
        "TaskData",
        "TaskError",
        "TaskMatchConfig",
        "TaskResources",
        "TaskTimeout",
        "Taskset",
        "TasksetConfig",
        "TextContentPart",
        "Tool",
        "ToolCall",
        "ToolMessage",
        "Toolset",
        "ToolsetConfig",
        "ToolsetError",
        "Trace",
        "TraceTask",
        "TunnelError",
        "Usage",
        "UserMessage",
        "WireTaskData",
        "adapt",
        "compare_stdout_results",
        "extract_boxed_answer",
        "install",
        "intercept",
        "metric",
        "parse_judge_choice",
        "parse_pytest_outcomes",
        "read_answer_file_or_last_reply",
        "reward",
        "stop",
        "tool",
        "verify_boxed_math_answer",
    ],
}
"""The public modules besides ``vfray`` itself (tests/test_public_api.py holds its list)."""

PUBLIC_SUBMODULES = {"vfray.train.torch", "vfray.train.weight_sync"}
"""Public modules that are not re-exported: the torch datasets need the ``train`` extra; the
vLLM weight-sync hook is a trainer's own choice of serving engine."""

INTERNAL_MARK = "Internal:"


# -- import-linter ---------------------------------------------------------------------------


def _lint_imports(cwd: Path) -> subprocess.CompletedProcess[str]:
    if not LINT_IMPORTS.exists():
        pytest.skip("import-linter is not installed (the dev extra)")
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(cwd), "PATH": "/usr/bin:/bin"},
        timeout=120,
    )


def test_every_import_linter_contract_is_kept() -> None:
    run = _lint_imports(REPO)
    assert run.returncode == 0, run.stdout[-3000:]
    assert "BROKEN" not in run.stdout and "6 kept, 0 broken" in run.stdout, run.stdout[-2000:]


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        # The task model reaching up into the CLI: the bottom layer importing the top one.
        ("vfray/task.py", "import vfray.cli.main\n", "vfray's layers"),
        # Ray outside actors/.
        ("vfray/rollout/machine.py", "import ray\n", "Ray stays in actors/"),
        # A lazy import counts as much as a top-level one.
        ("vfray/harnesses/seats.py", "def _f():\n    import vfray.run.driver\n", "vfray's layers"),
    ],
)
def test_a_planted_upward_import_breaks_a_contract(
    tmp_path: Path, module: str, line: str, contract: str
) -> None:
    for part in ("vfray", "actors"):
        shutil.copytree(REPO / part, tmp_path / part, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / module
    target.write_text(target.read_text() + "\n" + line)
    run = _lint_imports(tmp_path)
    assert run.returncode != 0
    broken = run.stdout.split("Broken contracts", 1)[-1]
    assert contract in broken, run.stdout[-2000:]


# -- cycles, counting every import ------------------------------------------------------------


def _modules(root: Path, package: str) -> dict[str, Path]:
    found = {}
    for path in (root / package).rglob("*.py"):
        parts = path.relative_to(root).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def import_graph(root: Path, packages: tuple[str, ...]) -> dict[str, set[str]]:
    """Module -> modules it imports, from every import statement anywhere in its file: at the
    top, inside functions, under ``if TYPE_CHECKING:``, relative ones, and ``from pkg import
    mod`` naming a submodule."""
    modules: dict[str, Path] = {}
    for package in packages:
        modules.update(_modules(root, package))
    edges: dict[str, set[str]] = defaultdict(set)

    def resolve(name: str) -> str | None:
        while name not in modules and "." in name:
            name = name.rsplit(".", 1)[0]
        return name if name in modules else None

    for name, path in modules.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
            for target in targets:
                resolved = resolve(target)
                if resolved is not None and resolved != name:
                    edges[name].add(resolved)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    nodes = sorted(set(edges) | {m for targets in edges.values() for m in targets})
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


def test_no_import_cycles_even_counting_type_checking_imports() -> None:
    found = cycles(import_graph(REPO, ("vfray", "actors")))
    assert found == [], "import cycles: " + " | ".join(" <-> ".join(c) for c in found)


def test_the_cycle_finder_sees_type_checking_relative_and_submodule_imports(
    tmp_path: Path,
) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import B\n"
    )
    (package / "b.py").write_text("def f():\n    from . import c\n")
    (package / "c.py").write_text("from pkg import a\n")
    (package / "d.py").write_text("import pkg.a\n")
    assert cycles(import_graph(tmp_path, ("pkg",))) == [["pkg.a", "pkg.b", "pkg.c"]]


# -- the public surface and what says it is internal --------------------------------------------


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_each_public_module_has_the_intended_sorted_all(module: str) -> None:
    loaded = importlib.import_module(module)
    assert loaded.__all__ == PUBLIC[module]
    for name in loaded.__all__:
        assert getattr(loaded, name) is not None, f"{module}.{name}"


def _docstring(path: Path) -> str:
    return ast.get_docstring(ast.parse(path.read_text())) or ""


def test_everything_outside_the_public_surface_says_it_is_internal() -> None:
    public = {"vfray", *PUBLIC, *PUBLIC_SUBMODULES, "vfray.compat", "vfray.__main__"}
    unmarked = []
    modules = _modules(REPO, "vfray")
    for name, path in sorted(modules.items()):
        parts = name.split(".")
        if name in public or any(p.startswith("_") and p != "__main__" for p in parts[1:]):
            continue  # public, or private by its name (a leading underscore says it)
        top_level = len(parts) == 2
        in_public_package = ".".join(parts[:-1]) in PUBLIC
        # A package's docstring speaks for its modules; top-level modules and the modules of
        # the public packages speak for themselves.
        if (top_level or in_public_package) and INTERNAL_MARK not in _docstring(path):
            unmarked.append(name)
    assert unmarked == [], f"modules that do not say {INTERNAL_MARK!r}: {unmarked}"
