"""``vfray eval`` of a v1 taskset that cannot run says why in one line, rc 2, naming the real
cause: a Hugging Face dataset that cannot be fetched (the CLI's own up-front read of the first
task, not only the run's), a dependency the package imports that is not installed, a verifiers
module vfray does not serve, an id that names nothing. And an env's own fields given as
``vf-eval`` flags reach the env as the same keys in a TOML do."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from vfray.cli.main import main

SEATS = str(Path(__file__).parent / "v1_tasksets" / "v1seats")

HUB_PACKAGE = """
import verifiers.v1 as vf
from datasets import load_dataset


class Row(vf.TaskData):
    answer: str = ""


class HubTask(vf.Task[Row]):
    @vf.reward
    async def correct(self, task, trace) -> float:
        return 1.0


class HubTaskset(vf.Taskset[HubTask]):
    def load(self):
        for row in load_dataset("openai/gsm8k", "main", split="test"):
            yield Row(prompt=row["question"], answer=row["answer"])


__all__ = ["HubTaskset"]
"""


def _package(root: Path, name: str, body: str) -> None:
    (root / name).mkdir(parents=True)
    (root / name / "__init__.py").write_text(textwrap.dedent(body))


def _eval(root: Path, spec: str, *flags: str) -> subprocess.CompletedProcess[str]:
    """The CLI as a user runs it (its own process: what the hub client logs counts too)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "VFRAY_"))}
    # Offline at once (no network here anyway): the same failure, without the client's retries.
    env.update(PYTHONPATH=str(root), HF_HUB_OFFLINE="1", HF_HOME=str(root / "hf"))
    argv = [sys.executable, "-m", "vfray.cli.main", "eval", spec, "-n", "1", *flags]
    return subprocess.run(
        [*argv, "--harness", "null"], cwd=root, env=env, capture_output=True, text=True
    )


def test_a_hub_dataset_that_cannot_be_fetched_is_one_line_rc_2(tmp_path: Path) -> None:
    _package(tmp_path, "hubts", HUB_PACKAGE)
    done = _eval(tmp_path, "hubts")
    assert done.returncode == 2, done.stderr[-2000:]
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("vfray: error: v1 taskset 'hubts': a Hugging Face dataset could not")
    assert "openai/gsm8k" in line and "give a local path" in line


@pytest.mark.parametrize(
    ("body", "cause"),
    [
        (
            "import verifiers.v1 as vf\nimport a_dependency_not_installed\n",
            "v1 taskset 'pkg': importing 'pkg' failed: No module named "
            "'a_dependency_not_installed' (the package is there",
        ),
        (
            "import verifiers.v1 as vf\nfrom verifiers.v1.tasksets import harbor\n",
            "verifiers.v1.tasksets.harbor is not served by vfray's verifiers v1 layer (it serves "
            "textarena there)",
        ),
        (
            "import verifiers.v1 as vf\nraise RuntimeError('broken at import')\n",
            "v1 taskset 'pkg': importing 'pkg' failed: RuntimeError: broken at import",
        ),
    ],
    ids=["missing-dependency", "unserved-verifiers-module", "raises-on-import"],
)
def test_a_bare_id_whose_import_fails_names_the_cause(
    tmp_path: Path, body: str, cause: str
) -> None:
    _package(tmp_path / "pkgs", "pkg", body)
    for spec in ("pkg", str(tmp_path / "pkgs" / "pkg")):  # by id (on the path) and by folder
        done = _eval(tmp_path / "pkgs", spec)
        assert done.returncode == 2, done.stderr[-2000:]
        [line] = done.stderr.strip().splitlines()
        assert cause.replace("'pkg'", repr(spec), 1) in line or cause in line, line
        assert "unknown taskset" not in line and "not a v1 taskset" not in line


WORDLE = {  # verifiers' wordle example, as its repository has it
    "__init__.py": """
        from verifiers.v1.tasksets.textarena import TextArenaEnv
        from wordle.taskset import WordleTaskset

        __all__ = ["TextArenaEnv", "WordleTaskset"]
    """,
    "taskset.py": """
        from typing import Literal

        import verifiers.v1 as vf
        from verifiers.v1.tasksets.textarena import (
            TextArenaConfig,
            TextArenaTask,
            TextArenaTaskset,
        )


        class WordleConfig(TextArenaConfig):
            game: Literal["Wordle-v0"] = "Wordle-v0"


        class WordleTaskset(TextArenaTaskset, vf.Taskset[TextArenaTask, WordleConfig]):
            pass
    """,
}


def test_wordle_imports_and_without_textarena_is_one_line_naming_it(tmp_path: Path) -> None:
    # verifiers.v1.tasksets.textarena is served, so wordle's package imports and its env and
    # taskset load; its tasks need textarena, nltk and nltk's data (downloaded by v1 at load,
    # so offline neither framework runs it): here textarena is not installed, one line rc 2.
    (tmp_path / "wordle").mkdir()
    for name, body in WORDLE.items():
        (tmp_path / "wordle" / name).write_text(textwrap.dedent(body))
    done = _eval(tmp_path, "wordle")
    assert done.returncode == 2, done.stderr[-2000:]
    [line] = done.stderr.strip().splitlines()
    assert "verifiers.v1.tasksets.textarena needs textarena and nltk (" in line, line
    assert "pip install textarena nltk" in line


def test_an_id_that_names_no_module_is_an_unknown_taskset(tmp_path: Path) -> None:
    done = _eval(tmp_path, "no_such_taskset_here")
    assert done.returncode == 2
    assert "unknown taskset 'no_such_taskset_here'" in done.stderr


def test_an_envs_own_fields_as_flags_are_the_tomls_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = ["--env.bonus", "3", "--env.solver.runtime.type", "subprocess", "--env.max-turns", "4"]
    assert main(["eval", SEATS, *flags, "--env.agent.harness.id", "null", "--dry-run"]) == 0
    from_flags = json.loads(capsys.readouterr().out)
    toml = tmp_path / "eval.toml"
    toml.write_text(
        '[env]\nbonus = 3\n[env.solver.runtime]\ntype = "subprocess"\n'
        '[env.agent.harness]\nid = "null"\n'
    )
    assert main(["eval", SEATS, f"@{toml}", "--env.max-turns", "4", "--dry-run"]) == 0
    from_toml = json.loads(capsys.readouterr().out)
    assert from_flags["taskset_args"]["env"] == {
        "id": None,
        "bonus": 3,
        "solver": {"runtime": {"type": "subprocess"}},
    }
    assert from_flags == from_toml
    # vfray's own env settings keep their meaning next to them.
    assert from_flags["env"]["max_turns"] == 4
