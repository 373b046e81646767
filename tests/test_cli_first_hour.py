"""What a new user meets in the first hour, through the real ``python -m vfray`` command in a
subprocess: defaults that work together, boolean flags, ``show`` by rollout index, errors with
their cause, preflight checks before Ray, progress without a terminal, Ray's temporary working
dir, near-miss options, and one ``vfray: error:`` line instead of tracebacks. Ctrl-C and SIGTERM
(on the local backend and on Ray) are in ``tests/test_signals.py``.

Most runs use ``--backend local`` (same driver, run folder and CLI, no Ray start-up).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.test_cli import cli_env

LOCAL = ("--backend", "local", "--harness", "null")

GROUP_TASKS = """
import vfray as vf


class Data(vf.TaskData):
    word: str


class Ranked(vf.Task[Data]):
    @vf.reward
    def said(self, trace: vf.Trace) -> bool:
        return self.data.word in (trace.last_reply or "")

    @vf.group_reward
    def rank(self, traces):
        return [1.0 for _ in traces]


class Tasks(vf.Taskset[Ranked]):
    def load(self):
        return [Ranked(Data(prompt="say a", word="a"), key="a")]
"""


def vfray(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    """``python -m vfray`` (the package's ``__main__``), exactly as a user would run it."""
    return subprocess.run(
        [sys.executable, "-m", "vfray", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env or cli_env(),
        timeout=timeout,
        check=False,
    )


def run_folder(stdout: str) -> Path:
    line = next(line for line in stdout.splitlines() if line.startswith("run folder: "))
    return Path(line.removeprefix("run folder: ").strip())


def one_error_line(proc: subprocess.CompletedProcess[str], *fragments: str) -> str:
    """The command failed with exactly one ``vfray: error:`` line and no traceback."""
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("vfray: error:")]
    assert len(lines) == 1, proc.stderr[-3000:]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def failed_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str, str]]:
    """A run against an endpoint nobody listens on (preflight skipped): every rollout fails
    with ProviderError after its retries."""
    out = tmp_path_factory.mktemp("failed")
    proc = vfray(
        "eval", "arithmetic", "-n", "3", "-r", "2", *LOCAL, "-o", str(out), "--no-preflight",
        "-m", "some-model", "--base-url", "http://127.0.0.1:9/v1",
        # Two quick retries and no circuit: the endpoint never comes back, and this module is
        # about how the failures are shown, not about riding out an outage.
        "--retry.provider-retries", "2", "--retry.backoff", "0.01", "--retry.circuit-failures", "0",
        cwd=out,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-3000:]
    yield run_folder(proc.stdout), proc.stdout, proc.stderr


# -- 1. defaults work together ------------------------------------------------------------


def test_builtin_taskset_runs_with_the_default_one_rollout(tmp_path: Path) -> None:
    proc = vfray("eval", "arithmetic", "-n", "2", *LOCAL, "-o", str(tmp_path), "--no-progress")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "brevity_rank" in proc.stderr and "-r 2" in proc.stderr  # the note says why
    assert "2 / 2" in proc.stdout
    assert "reward/brevity_rank" not in proc.stdout


def test_group_rewards_the_user_asked_for_are_still_refused_with_one_rollout(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ranked.py"
    path.write_text(GROUP_TASKS)
    own = vfray("eval", f"{path}:Tasks", *LOCAL, "-o", str(tmp_path), "-m", "scripted:echo")
    assert own.returncode == 2
    one_error_line(own, "rank", "n must be at least 2")
    builtin = vfray(
        "eval", "arithmetic", "-n", "2", *LOCAL, "--taskset-args", '{"group_rewards": true}',
        "-o", str(tmp_path),
    )  # fmt: skip
    assert builtin.returncode == 2
    one_error_line(builtin, "brevity_rank", "n must be at least 2")


# -- 2. the scaffold's suggested eval scores well ------------------------------------------


def test_init_suggests_an_eval_that_scores_well_and_installs_without_the_index(
    tmp_path: Path,
) -> None:
    made = vfray("init", "word-check", "--dir", str(tmp_path))
    assert made.returncode == 0, made.stderr
    root = tmp_path / "word-check"
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    # vfray is not on the package index: a dependency on it would make `pip install` fail.
    assert not any(re.match(r"vfray\b", dep) for dep in project["dependencies"])
    readme = (root / "README.md").read_text()
    suggested = next(line for line in readme.splitlines() if line.startswith("vfray eval "))
    assert suggested in made.stdout
    args = suggested.split()[2:]
    # The entry-point name needs `pip install -e .`; its target is the same class.
    assert args[0] == "word-check"
    args[0] = f"{root}/word_check/taskset.py:WordCheckTaskset"
    proc = vfray("eval", *args, "--backend", "local", "-o", str(tmp_path / "out"), "--no-progress")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "8 / 8" in proc.stdout
    assert re.search(r"reward \(mean of per-rollout reward\)\s*│\s*1 ± 0", proc.stdout), proc.stdout


# -- 3. boolean flags, show by rollout index -------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--shuffle"], True),
        (["--no-shuffle"], False),
        (["--shuffle", "false"], False),
        (["--shuffle=false"], False),
        (["--shuffle", "yes"], True),
    ],
)
def test_boolean_options_are_flags(flags: list[str], expected: bool) -> None:
    proc = vfray("eval", "arithmetic", *flags, "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["shuffle"] is expected


def test_a_bare_flag_before_the_positional_does_not_eat_it() -> None:
    proc = vfray("eval", "--shuffle", "arithmetic", "-n", "3", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    config = json.loads(proc.stdout)
    assert config["shuffle"] is True and config["taskset"] == "arithmetic"


def test_show_selects_by_rollout_index_and_task(failed_run: tuple[Path, str, str]) -> None:
    folder, _, _ = failed_run
    ambiguous = vfray("show", str(folder), "--rollout", "1")
    assert ambiguous.returncode == 2
    line = one_error_line(ambiguous, "rollout 1 exists for 3 tasks", "--task KEY")
    key = line.split("keys: ")[1].split(",")[0].strip()
    picked = vfray("show", str(folder), "--rollout", "1", "--task", key)
    assert picked.returncode == 0, picked.stderr
    assert f"task {key}  rollout 1  attempt 2" in picked.stdout  # the last attempt of index 1
    assert "ProviderError" in picked.stdout
    out_of_range = vfray("show", str(folder), "--rollout", "2", "--task", key)
    assert out_of_range.returncode == 2
    one_error_line(out_of_range, "rollout index in 0..1")
    assert "rollout index N" in vfray("show", "-h").stdout


# -- 4. errors during a run are visible ------------------------------------------------------


def test_the_cause_of_each_error_type_is_printed_under_the_table(
    failed_run: tuple[Path, str, str],
) -> None:
    folder, stdout, stderr = failed_run
    after_table = stdout.split("└")[-1]
    assert "ProviderError x6" in after_table
    assert "127.0.0.1:9" in after_table  # the cause itself, not just a count
    assert f"vfray show {folder} --task" in after_table
    # 12 retries, one warning each: the console shows the first, eval.log keeps them all.
    retry_lines = [line for line in stderr.splitlines() if "retrying" in line]
    assert len(retry_lines) == 1, stderr
    log = (folder / "eval.log").read_text()
    assert log.count("retrying") == 12
    assert "ProviderError x6" in log and "summary:" in log


# -- 5. preflight, before Ray ----------------------------------------------------------------


def test_an_unreachable_endpoint_is_one_line_naming_the_url(tmp_path: Path) -> None:
    started = time.monotonic()
    proc = vfray(
        "eval", "arithmetic", "-n", "2", "-r", "2", "--harness", "null", "-m", "m",
        "--base-url", "http://127.0.0.1:9/v1", "-o", str(tmp_path),
    )  # fmt: skip
    assert proc.returncode == 2
    one_error_line(proc, "http://127.0.0.1:9/v1/chat/completions", "unreachable")
    assert "starting a local Ray" not in proc.stderr  # refused before Ray
    assert not list(tmp_path.iterdir())  # and before any run folder
    assert time.monotonic() - started < 60  # no 3 x 2 retried rollouts


def test_an_answering_endpoint_passes_preflight(tmp_path: Path) -> None:
    server = subprocess.Popen(
        [sys.executable, "-m", "vfray", "serve-model", "--policy", "arithmetic", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
        env=cli_env(),
    )
    try:
        assert server.stdout is not None
        url = server.stdout.readline().split("serving at ")[1].strip()
        proc = vfray(
            "eval", "arithmetic", "-n", "2", "-r", "2", *LOCAL, "-m", "scripted",
            "--base-url", url, "-o", str(tmp_path), "--no-progress",
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "4 / 4" in proc.stdout
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_an_output_path_that_is_a_file_is_refused_before_ray(tmp_path: Path) -> None:
    target = tmp_path / "outputs"
    target.write_text("not a folder")
    proc = vfray("eval", "arithmetic", "-n", "2", "-r", "2", "--harness", "null", "-o", str(target))
    assert proc.returncode == 2
    one_error_line(proc, str(target), "not a directory")
    assert "starting a local Ray" not in proc.stderr


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    """A folder nobody can write in: a read-only tmpfs as root (root ignores mode bits)."""
    path = tmp_path / "ro"
    path.mkdir()
    if os.geteuid() != 0:
        path.chmod(0o555)
        yield path
        path.chmod(0o755)
        return
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=False)


def test_a_read_only_output_dir_is_one_line(read_only_dir: Path) -> None:
    proc = vfray(
        "eval", "arithmetic", "-n", "2", "-r", "2", "--harness", "null", "-o", str(read_only_dir)
    )
    assert proc.returncode == 2
    one_error_line(proc, str(read_only_dir), "not writable")
    assert "starting a local Ray" not in proc.stderr


# -- 6 + 7. progress without a terminal; interrupts; resume counts the whole run ------------------


def test_progress_without_a_terminal_is_newline_terminated_lines(tmp_path: Path) -> None:
    proc = vfray(
        "eval", "arithmetic", "-n", "4", "-r", "2", *LOCAL, "-o", str(tmp_path),
        "-m", "scripted:arithmetic?latency=3", "-c", "2",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("rollouts ")]
    assert len(lines) >= 2, proc.stderr  # a line every few seconds, not one at the very end
    assert lines[-1].startswith("rollouts 8/8")
    assert proc.stderr.endswith("\n")
    # One definition of reward: the progress line shows the table's mean (1 + 0.1 x rank).
    table = re.search(r"reward \(mean of per-rollout reward\)\s*│\s*([\d.]+)", proc.stdout)
    assert table is not None, proc.stdout
    shown = float(re.search(r"reward ([\d.]+)", lines[-1]).group(1))  # type: ignore[union-attr]
    assert shown == pytest.approx(float(table.group(1)), abs=1e-3)
    assert shown > 1.0  # the group reward is in both


def test_ray_failing_to_start_is_one_line(tmp_path: Path) -> None:
    """Ray's start-up raising (here: its temp dir cannot be created) is one line, no stack."""
    proc = vfray(
        "eval", "arithmetic", "-n", "2", "-r", "2", "--harness", "null", "-o", str(tmp_path),
        env=cli_env(RAY_TMPDIR="/proc/no-such-dir"),
    )  # fmt: skip
    assert proc.returncode == 1
    one_error_line(proc, "starting on Ray failed", "/proc/no-such-dir", "--backend local")


# -- 8. Ray's temporary working dir ----------------------------------------------------------------


def test_outputs_leave_rays_temporary_working_dir(tmp_path: Path) -> None:
    copy = tmp_path / "session_x" / "runtime_resources" / "working_dir_files" / "_ray_pkg_ab"
    copy.mkdir(parents=True)
    home = tmp_path / "home"
    env = cli_env(HOME=str(home))
    proc = vfray("eval", "arithmetic", "--dry-run", cwd=copy, env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["output_dir"] == str(home / "vfray-outputs")
    assert "temporary working-dir copy" in proc.stderr
    relative = vfray("eval", "arithmetic", "--dry-run", "-o", "outs", cwd=copy, env=env)
    assert relative.returncode == 2
    one_error_line(relative, "absolute -o")


def test_the_printed_run_folder_is_absolute(tmp_path: Path) -> None:
    proc = vfray(
        "eval", "arithmetic", "-n", "1", "-r", "2", *LOCAL, "-o", "outs", "--no-progress",
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    folder = run_folder(proc.stdout)
    assert folder.is_absolute() and folder.is_dir()
    assert folder.is_relative_to(tmp_path / "outs")


# -- 9. near misses ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("typo", "meant"),
    [("--harnes", "--harness"), ("--shufle", "--shuffle"), ("--runtim", "--runtime")],
)
def test_did_you_mean_finds_the_obvious_option(typo: str, meant: str) -> None:
    proc = vfray("eval", "arithmetic", typo, "x")
    assert proc.returncode == 2
    line = one_error_line(proc)
    assert f"Did you mean: {meant}?" in line or f"Did you mean: {meant}," in line


def test_a_taskset_that_fails_to_import_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "broken_tasks.py"
    path.write_text("import vfray as vf\n\nDATA = {}\nWORDS = DATA['words']\n")
    for spec, env in (
        (f"{path}:Tasks", cli_env()),
        (
            "broken_tasks:Tasks",
            cli_env(PYTHONPATH=f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}"),
        ),
    ):
        proc = vfray("eval", spec, "--dry-run", env=env)
        assert proc.returncode == 2
        one_error_line(proc, f"{path}:4", "KeyError", "words")


# -- 10. one line instead of a traceback ------------------------------------------------------


def test_a_non_utf8_config_file_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_bytes("num_tasks = 3\n# caf\xe9\n".encode("latin-1"))
    proc = vfray("eval", f"@{path}", "--dry-run")
    assert proc.returncode == 2
    one_error_line(proc, str(path), "UTF-8")


def test_a_corrupt_parquet_part_is_one_line_in_show_and_resume(
    failed_run: tuple[Path, str, str], tmp_path: Path
) -> None:
    import shutil

    folder = tmp_path / "copy"
    shutil.copytree(failed_run[0], folder)
    part = sorted((folder / "traces").glob("*.parquet"))[0]
    part.write_bytes(part.read_bytes()[: part.stat().st_size // 2])
    for args in (["show", str(folder)], ["resume", str(folder)]):
        proc = vfray(*args)
        assert proc.returncode == 2, proc.stdout + proc.stderr[-3000:]
        one_error_line(proc, str(folder))


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    path = tmp_path / "tiny"
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48k", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=False)


def test_a_full_disk_during_a_run_is_one_line_with_the_resume_command(tiny_disk: Path) -> None:
    proc = vfray(
        "eval", "arithmetic", "-n", "60", "-r", "2", *LOCAL, "-o", str(tiny_disk), "--no-progress"
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    folder = next(tiny_disk.glob("*/*/config.json")).parent
    one_error_line(proc, "no space left on device", str(folder), f"vfray resume {folder}")
