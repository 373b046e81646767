"""What ``import verifiers.v1`` serves on vfray (``vfray.compat.v1._surface``): the v1 submodules
taskset code imports from, with the same objects as on ``verifiers.v1``; every other
``verifiers`` module and every public v1 name vfray does not implement fails in one line naming
it; and the served list is checked against verifiers 0.4.0's own package where it installs."""

from __future__ import annotations

import importlib
import json
import subprocess
from pathlib import Path

import pytest
from agent_tools import need_registry

import vfray.compat.v1 as layer
from vfray.compat.v1._surface import (
    PACKAGES,
    SUBMODULES,
    V1_PUBLIC,
    NotServedError,
    NotServedModuleError,
)
from vfray.errors import ConfigError
from vfray.runtimes.provision import ToolSpec, ensure_tool

# Names that live only in their module: the user-sim env's, utils.image's, the TextArena taskset's.
TEXTARENA = SUBMODULES["verifiers.v1.tasksets.textarena"]
_OWN = {"UserSimEnv", "UserSimEnvConfig", "image_data_url", "DataT", *TEXTARENA}


@pytest.fixture
def v1() -> object:
    layer.install()
    return importlib.import_module("verifiers.v1")


@pytest.mark.parametrize("module", sorted(SUBMODULES))
def test_each_served_submodule_has_the_layers_objects(v1: object, module: str) -> None:
    served = importlib.import_module(module)
    for name in SUBMODULES[module]:
        if name not in _OWN:
            assert getattr(served, name) is getattr(v1, name), (module, name)
    exec(f"from {module} import {', '.join(SUBMODULES[module])}", {})


@pytest.mark.parametrize(
    "module", ["verifiers.v1.utils.loaders", "verifiers.v1.agent", "verifiers.v0", "verifiers.v1.x"]
)
def test_a_module_not_served_is_one_line_naming_it(v1: object, module: str) -> None:
    with pytest.raises(ModuleNotFoundError) as refused:
        importlib.import_module(module)
    assert isinstance(refused.value, NotServedModuleError | ConfigError)
    line = str(refused.value)
    assert "\n" not in line and line.startswith(f"{module} is not served by vfray's verifiers v1")
    assert "verifiers.v1.envs.best_of_n" in line  # and says what is served


@pytest.mark.parametrize(
    ("statement", "named"),
    [
        ("from verifiers.v1 import Agent", "verifiers.v1.Agent"),
        ("import verifiers.v1 as vf; vf.load_taskset", "verifiers.v1.load_taskset"),
        ("from verifiers.v1.trace import ModelCall", "verifiers.v1.trace.ModelCall"),
        ("from verifiers import Environment", "verifiers.Environment"),
    ],
)
def test_a_v1_name_not_served_is_one_line_naming_it(v1: object, statement: str, named: str) -> None:
    with pytest.raises(NotServedError) as refused:
        exec(statement, {})
    line = str(refused.value)
    assert "\n" not in line and line.startswith(f"{named} is not served by vfray's verifiers v1")
    assert isinstance(refused.value, ImportError)


def test_every_v1_name_is_served_or_refused_in_one_line_naming_it(v1: object) -> None:
    # All 173 of v1 0.4.0's public names: a served one is an object on verifiers.v1 (and in
    # every served submodule that lists it, the same one); any other raises one line naming it.
    served, refused = [], []
    for name in V1_PUBLIC:
        try:
            found = getattr(v1, name)
        except NotServedError as exc:
            line = str(exc)
            assert "\n" not in line, name
            assert line.startswith(f"verifiers.v1.{name} is not served by vfray's"), line
            refused.append(name)
            continue
        assert found is not None and name in layer.__all__, name
        served.append(name)
    for module, names in SUBMODULES.items():
        for name in set(names) & set(served):
            assert getattr(importlib.import_module(module), name) is getattr(v1, name)
    assert len(served) + len(refused) == len(V1_PUBLIC) == 173
    assert len(served) >= 76, len(served)  # docs/guides/v1.md's count


def test_dunder_probes_and_unknown_names_stay_plain_attribute_errors(v1: object) -> None:
    import verifiers.v1.task as task

    assert not hasattr(task, "__wrapped__") and not hasattr(layer, "not_a_v1_name")
    assert [n for n in layer.__all__ if n in V1_PUBLIC and not hasattr(layer, n)] == []


def test_the_served_surface_matches_verifiers_0_4_0(tmp_path: Path) -> None:
    # Every name served from a submodule is there in verifiers 0.4.0, and V1_PUBLIC is its
    # `verifiers.v1.__all__`.
    need_registry("pypi")
    spec = ToolSpec(name="verifiers", kind="pypi", package="verifiers", version="0.4.0")
    python = ensure_tool(spec).executable("python")
    probe = (
        "import importlib, json, sys\n"
        "import verifiers.v1 as vf\n"
        "import ast, importlib.util\n"
        "def has(m, n):\n"
        "    try:\n"
        "        return hasattr(importlib.import_module(m), n)\n"
        "    except ImportError:  # textarena's needs textarena: its __all__, read\n"
        "        tree = ast.parse(open(importlib.util.find_spec(m).origin).read())\n"
        "        return n in next(ast.literal_eval(a.value) for a in tree.body\n"
        "            if isinstance(a, ast.Assign) and a.targets[0].id == '__all__')\n"
        "asked = json.loads(sys.argv[1])\n"
        "missing = [f'{m}.{n}' for m, names in asked.items() for n in names if not has(m, n)]\n"
        "packages = [importlib.import_module(p).__name__ for p in json.loads(sys.argv[2])]\n"
        "scored = [getattr(vf, f)(*a, **k) for f, a, k in json.loads(sys.argv[3])]\n"
        "print(json.dumps({'all': sorted(vf.__all__), 'missing': missing, 'scored': scored}))"
    )
    done = subprocess.run(
        [python, "-c", probe, json.dumps(SUBMODULES), json.dumps(PACKAGES), json.dumps(SCORED)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout)
    assert found["missing"] == []
    assert sorted(V1_PUBLIC) == found["all"]
    # The scoring helpers served give what verifiers' own give on the same inputs.
    ours = [getattr(layer, f)(*a, **k) for f, a, k in SCORED]
    assert json.loads(json.dumps(ours)) == found["scored"]


SCORED: list[tuple[str, list[object], dict[str, object]]] = [
    ("extract_boxed_answer", ["so \\boxed{\\frac{1}{2}} and \\boxed{x^{2}}"], {}),
    ("extract_boxed_answer", ["no box"], {"strict": True}),
    ("extract_boxed_answer", ["open \\boxed{1"], {}),
    ("parse_judge_choice", ["<think>B</think>I think A.\nVERDICT: b"], {"choices": ["A", "B"]}),
    ("parse_judge_choice", ["ALLOW, no wait: BLOCK"], {"choices": ["BLOCK", "ALLOW"]}),
    ("parse_judge_choice", ["<think>unclosed A"], {}),
    ("parse_judge_choice", ["\\boxed{C}"], {}),
    ("compare_stdout_results", ["1.0001 2\n", "1.0 2"], {}),
    ("compare_stdout_results", ["a  b\n\nc", "a b c"], {}),
    ("compare_stdout_results", ["1 2", "1 3"], {}),
    ("compare_stdout_results", ["nan", "nan "], {}),
    (
        "parse_pytest_outcomes",
        [
            "\x1b[32mPASSED\x1b[0m t.py::a\nFAILED t.py::b[x - y] - assert 0\n"
            "SKIPPED [1] t.py:3: no\nERROR t.py::c\nnoise"
        ],
        {},
    ),
]
"""Scoring helpers' calls: (name, args, kwargs), run on both frameworks."""
