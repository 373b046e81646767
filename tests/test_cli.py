"""The ``vfray`` command as users run it: a real subprocess, a real local Ray for the two
runs that need one, the run folder on disk, and the exit-code contract (2 for config or usage
errors, 1 only when every rollout failed)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from vfray.cli.main import build_parser, main
from vfray.cli.overrides import SKIP
from vfray.config import EvalConfig, iter_fields

TASKS_MODULE = """
import vfray as vf


class WordData(vf.TaskData):
    word: str


class WordTask(vf.Task[WordData]):
    @vf.reward
    def said(self, trace: vf.Trace) -> bool:
        return self.data.word in (trace.last_reply or "")


class Words(vf.Taskset[WordTask]):
    def load(self):
        return [WordTask(WordData(prompt=f"say {w}", word=w), key=w) for w in ("a", "b", "c")]


class BrokenTask(WordTask):
    def setup(self, trace, runtime):
        raise RuntimeError("this task cannot be set up")


class Broken(vf.Taskset[BrokenTask]):
    def load(self):
        return [BrokenTask(WordData(prompt="say x", word="x"), key="x")]
"""


def as_from_a_terminal() -> None:
    """A ``preexec_fn``: the child starts with Ctrl-C and SIGTERM as a terminal gives them
    (default action, not blocked), whatever this test worker's earlier tests left on it. A
    worker of CI's suite twice handed them on ignored or blocked (its vfray ran to rc 0 through
    a Ctrl-C), and vfray rightly keeps an ignored SIGINT ignored (a background job's rule)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})


def signal_state() -> str:
    """What this worker would hand a child: SIGINT's handler and the blocked signals."""
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    return f"worker SIGINT handler {signal.getsignal(signal.SIGINT)}, blocked {sorted(blocked)}"


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VFRAY_", "RAY_ADDRESS"))}
    env.update(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", COLUMNS="120")
    env.update(extra)
    return env


def vfray(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vfray.cli.main", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env or cli_env(),
        timeout=timeout,
        check=False,
    )


def vfray_here(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """The same command in this process: for paths that start no Ray (faster than a spawn)."""
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def run_folder_from(stdout: str) -> Path:
    line = next(line for line in stdout.splitlines() if line.startswith("run folder: "))
    return Path(line.removeprefix("run folder: ").strip())


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One real ``vfray eval`` (local Ray): the run the show/resume tests read."""
    out = tmp_path_factory.mktemp("outputs")
    proc = vfray(
        "eval", "arithmetic", "-n", "4", "-r", "2", "--harness", "null", "-o", str(out),
        "--no-progress", cwd=out,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rollouts (ok / total)" in proc.stdout and "8 / 8" in proc.stdout
    yield run_folder_from(proc.stdout)


@pytest.fixture
def tasks_file(tmp_path: Path) -> Path:
    path = tmp_path / "word_tasks.py"
    path.write_text(TASKS_MODULE)
    return path


# -- a real run and its folder ------------------------------------------------------------


def test_eval_writes_a_complete_run_folder(finished_run: Path) -> None:
    assert finished_run.is_dir()
    assert finished_run.parent.name == "arithmetic--scripted_arithmetic--null"
    header = json.loads((finished_run / "config.json").read_text())
    assert header["config"]["env"]["harness"]["id"] == "null"
    assert header["config"]["num_tasks"] == 4
    assert set(header["versions"]) >= {"vfray", "ray", "python"}
    traces = sorted((finished_run / "traces").glob("*.parquet"))
    episodes = sorted((finished_run / "episodes").glob("*.parquet"))
    assert traces and episodes
    assert sum(pq.read_metadata(p).num_rows for p in traces) == 8
    assert sum(pq.read_metadata(p).num_rows for p in episodes) == 4
    log = (finished_run / "eval.log").read_text()
    assert "vfray eval arithmetic" in log and "summary:" in log


def test_show_prints_the_table_and_one_transcript(
    finished_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table = vfray("show", str(finished_run))
    assert table.returncode == 0, table.stderr
    assert "8 / 8" in table.stdout and "reward/correct" in table.stdout
    key = pq.read_table(sorted((finished_run / "traces").glob("*.parquet"))[0])["task_key"][0]
    code, out, err = vfray_here(
        capsys, "show", str(finished_run), "--rollout", "1", "--task", key.as_py()
    )
    assert code == 0, err
    assert "user: What is" in out and "assistant:" in out
    assert "rollout 1" in out and "reward correct = 1.0" in out
    code, _, err = vfray_here(capsys, "show", str(finished_run), "--rollout", "99")
    assert code == 2 and "--rollout must be a rollout index in 0..1" in err


def test_resume_with_nothing_to_do_is_a_no_op(finished_run: Path) -> None:
    before = sorted(p.name for p in (finished_run / "traces").iterdir())
    proc = vfray("resume", str(finished_run), "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert "nothing to resume" in proc.stdout and "8 / 8" in proc.stdout
    assert sorted(p.name for p in (finished_run / "traces").iterdir()) == before


def test_every_rollout_failing_exits_1(tmp_path: Path, tasks_file: Path) -> None:
    """A ``path/to/file.py:Class`` taskset whose every rollout fails: exit 1, table printed."""
    proc = vfray(
        "eval", f"{tasks_file}:Broken", "-r", "2", "--harness", "null", "-o", str(tmp_path),
        "--no-progress", "-m", "scripted:echo", "--backend", "local",
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    assert "0 / 2" in proc.stdout
    assert "error/" in proc.stdout


# -- configuration, without Ray --------------------------------------------------------------


def test_dry_run_applies_precedence(tmp_path: Path) -> None:
    toml = tmp_path / "c.toml"
    toml.write_text('num_tasks = 5\n[env.harness]\nid = "null"\n[sampling]\ntemperature = 0.2\n')
    env = cli_env(VFRAY_SAMPLING__TEMPERATURE="0.9", VFRAY_MAX_CONCURRENT="7")
    proc = vfray(
        "eval", "arithmetic", f"@{toml}", "--dry-run", "--env.harness.id", "bash",
        "--sampling.temperature", "0.7", "--env.max-turns", "8",
        "--env.runtime.type", "bwrap", "--env.runtime.options.share_network", "false", env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    config = json.loads(proc.stdout)
    assert config["sampling"]["temperature"] == 0.7  # flag > TOML > env
    assert config["env"]["harness"]["id"] == "bash"  # flag > TOML
    assert config["env"]["max_turns"] == 8
    assert config["num_tasks"] == 5  # TOML > default
    assert config["max_concurrent"] == 7  # env > default
    assert config["env"]["runtime"]["options"] == {"share_network": False}


def test_dry_run_refuses_an_option_the_runtime_does_not_take() -> None:
    proc = vfray(
        "eval", "arithmetic", "--dry-run", "--env.runtime.type", "subprocess",
        "--env.runtime.options.share_network", "false",
    )  # fmt: skip
    assert proc.returncode == 2
    assert "bad options for runtime 'subprocess': share_network" in proc.stderr


def test_module_class_taskset(
    tasks_file: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(tasks_file.parent))
    code, out, err = vfray_here(capsys, "eval", "word_tasks:Words", "--dry-run")
    assert code == 0, err
    assert json.loads(out)["taskset"] == "word_tasks:Words"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["eval", "arithmetc", "--dry-run"], "did you mean 'arithmetic'"),
        (["eval", "arithmetic", "--env.max_turn", "3"], "Did you mean: --env.max_turns"),
        (["eval", "arithmetic", "--env.max-turns", "lots"], "env.max_turns"),
        (["eval", "arithmetic", "config.toml"], "write @config.toml"),
        (["eval", "arithmetic", "-m", "gpt-4o", "--dry-run"], "needs a base_url"),
        (["eval", "no_such_module:Tasks", "--dry-run"], "cannot import module"),
        (["resume", "."], "not a vfray run folder"),
        (["show", "."], "not a vfray run folder"),
    ],
)
def test_usage_errors_exit_2_with_a_clear_message(
    tmp_path: Path,
    args: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = vfray_here(capsys, *args)
    assert code == 2, out + err
    assert message in err
    assert "Traceback" not in err


def test_every_config_leaf_has_a_flag() -> None:
    parser = build_parser()
    eval_parser = next(
        choice
        for action in parser._subparsers._group_actions  # type: ignore[union-attr]
        for name, choice in action.choices.items()  # type: ignore[union-attr]
        if name == "eval"
    )
    options = set(eval_parser._option_string_actions)
    for dotted, _, _ in iter_fields(EvalConfig):
        if dotted not in SKIP:
            assert f"--{dotted}" in options
            assert f"--{dotted.replace('_', '-')}" in options


# -- validate and init ----------------------------------------------------------------------

BAD_TASKS = """
import vfray as vf


class Data(vf.TaskData):
    n: int
    value: float


class Checked(vf.Task[Data]):
    def validate(self, runtime):
        if self.data.n == 2:
            raise ValueError("task 2 needs a GPU")


class Bad(vf.Taskset[Checked]):
    def load(self):
        yield Checked(Data(prompt="a", n=0, value=1.0), key="same")
        yield Checked(Data(prompt="b", n=1, value=2.0), key="same")
        yield Checked(Data(prompt="c", n=2, value=float("nan")), key="nan")
"""


def test_validate_reports_every_problem(tmp_path: Path) -> None:
    path = tmp_path / "bad_tasks.py"
    path.write_text(BAD_TASKS)
    proc = vfray("validate", f"{path}:Bad", "-n", "10")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "unique key" in proc.stdout  # duplicate "same"
    assert "round-trip" in proc.stdout  # NaN does not survive JSON
    assert "task 2 needs a GPU" in proc.stdout  # Task.validate ran in a runtime
    assert "3 tasks checked" in proc.stdout


def test_validate_a_good_taskset_passes(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = vfray_here(capsys, "validate", "arithmetic", "-n", "3")
    assert code == 0, out + err
    assert "no problems" in out


def test_init_scaffolds_a_package_whose_tests_pass(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    proc = vfray("init", "word-check", "--dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    root = tmp_path / "word-check"
    pyproject = (root / "pyproject.toml").read_text()
    assert '[project.entry-points."vfray.tasksets"]' in pyproject
    assert 'word-check = "word_check.taskset:WordCheckTaskset"' in pyproject
    tests = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=root,
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=120,
        check=False,
    )
    assert tests.returncode == 0, tests.stdout + tests.stderr
    assert "2 passed" in tests.stdout
    code, _, err = vfray_here(capsys, "init", "word-check", "--dir", str(tmp_path))
    assert code == 2 and "not empty" in err
    code, out, err = vfray_here(
        capsys, "validate", f"{root}/word_check/taskset.py:WordCheckTaskset"
    )
    assert code == 0, out + err
