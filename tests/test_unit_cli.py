"""vfray.cli's parts below the commands: free ``--section.key`` overrides and their did-you-mean,
boolean flags, the results table and the first cause of each error type, ``eval.log``'s
buffering and the console's repeat filter, and a run's stops (Ctrl-C, SIGTERM, a full disk, Ray
failing to start) turned into one line with the resume command. tests/test_cli*.py run the
commands themselves."""

from __future__ import annotations

import errno
import logging
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from rich.console import Console

from vfray.cli import lifecycle, runlog
from vfray.cli.overrides import (
    _parse_value,
    config_option_names,
    near_options,
    normalize_bool_flags,
    open_sections,
    parse_free_overrides,
)
from vfray.cli.report import error_lines, results_table
from vfray.config import EvalConfig, parse_literal
from vfray.errors import ConfigError
from vfray.run.error_examples import ErrorExample, first_errors

# --- overrides ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "value"),
    [
        ("8", "8"),  # pydantic converts against the field's type
        ("true", "true"),
        ('{"a": 1}', {"a": 1}),
        ("[1, 2]", [1, 2]),
        ("{not json", "{not json"),
        ("  [3]  ", [3]),
    ],
)
def test_typed_option_values_are_json_only_for_objects_and_lists(raw: str, value: Any) -> None:
    assert _parse_value(raw) == value


@pytest.mark.parametrize(
    ("raw", "value"),
    [
        ("8", 8),
        ("0.5", 0.5),
        ("true", True),
        ("null", None),
        ('"quoted"', "quoted"),
        ("[1, 2]", [1, 2]),
        ("python:3.11", "python:3.11"),
        ("True", "True"),  # not JSON: the string
    ],
)
def test_open_section_values_are_json_literals_else_strings(raw: str, value: Any) -> None:
    assert parse_literal(raw) == value


@pytest.mark.parametrize(
    ("argv", "normalized"),
    [
        (["--shuffle"], ["--shuffle=true"]),
        (["--shuffle", "arithmetic"], ["--shuffle=true", "arithmetic"]),  # not swallowed
        (["--shuffle", "no"], ["--shuffle=no"]),
        (["--shuffle", "OFF", "-n", "3"], ["--shuffle=OFF", "-n", "3"]),
        (["--env.count-failed", "1"], ["--env.count-failed=1"]),
        (["--shuffle=false"], ["--shuffle=false"]),
        (["x", "--", "--shuffle"], ["x", "--", "--shuffle"]),  # after --: left alone
    ],
)
def test_boolean_flags_take_a_value_only_when_it_is_a_boolean_word(
    argv: list[str], normalized: list[str]
) -> None:
    assert normalize_bool_flags(argv) == normalized


def test_open_sections_are_dict_fields_and_models_that_allow_any_key() -> None:
    sections = open_sections()
    for name in ("sampling", "taskset_args", "env.harness.options", "env.runtime.options"):
        assert name in sections
    assert "env" not in sections and "model" not in sections


def test_free_overrides_under_open_sections_are_parsed_as_literals() -> None:
    extra = [
        "--env.runtime.options.image",
        "python:3.12",
        "--sampling.top-k=40",
        "--env.harness.options.tools",
        '["bash"]',
        "--taskset-args.level",
        "hard",
    ]
    assert parse_free_overrides(extra) == {
        "env.runtime.options.image": "python:3.12",
        "sampling.top_k": 40,
        "env.harness.options.tools": ["bash"],
        "taskset_args.level": "hard",
    }


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["stray"], "unexpected argument 'stray'"),
        (["--"], "unexpected argument '--'"),
        (["--harnes", "bash"], "unknown option '--harnes'. Did you mean: --harness?"),
        (["--env.max-turn=3"], "unknown option '--env.max-turn'. Did you mean: --env.max-turns?"),
        (["--zzzzzzzz", "1"], "unknown option '--zzzzzzzz'."),
        (["--sampling.temperature"], "option '--sampling.temperature' needs a value"),
        (
            ["--sampling.temperature", "--sampling.top_p", "1"],
            "option '--sampling.temperature' needs a value",
        ),
    ],
)
def test_bad_free_overrides_are_one_line_with_near_matches(extra: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_free_overrides(extra, known=["--backend", "--resume-from"])
    assert str(info.value).startswith(message)


def test_near_matches_prefer_prefixes_then_fewest_edits_and_name_an_option_once() -> None:
    known = config_option_names()
    assert near_options("--harn", known)[0] == "--harness"
    assert near_options("--env.max_turns=4", known) == ["--env.max_turns"]
    # --env.max_turns and --env.max-turns are one option: named once.
    assert len([o for o in near_options("--env.max-turnz", known) if "max" in o]) == 1
    assert near_options("--backnd", ["--backend", "-b"]) == ["--backend"]  # short ones skipped
    assert near_options("--qqqqqqqqqq", known) == []


# --- the results table and the first error of each type -----------------------------------------


def _rendered(summary: dict[str, Any]) -> str:
    console = Console(record=True, width=200)
    console.print(results_table(summary))
    return console.export_text()


BASE = {"ok": 3, "rollouts": 4, "input_tokens": 100, "output_tokens": 20}


def test_the_results_table_shows_what_the_summary_holds() -> None:
    text = _rendered(
        {
            **BASE,
            "attempts": 6,
            "reward_mean": 0.123456,
            "reward_stderr": 0.05,
            "reward_mean_counted": 0.2,
            "groups_untrainable": 1,
            "pass@1": 0.5,
            "pass@4": 0.75,
            "seats": {"solver": 1.0},
            "rewards": {"correct": 0.5},
            "metrics": {"turns": None},
            "errors": {"SandboxError": 1},
            "stop_conditions": {"completed": 3},
            "phase_seconds_mean": {"agent": 1.23456, "setup": None},
        }
    )
    for row in (
        "rollouts (ok / total)",
        "3 / 4",
        "attempts (incl. retried)",
        "0.1235 ± 0.05",
        "reward (infra failures left out)",
        "groups with < 2 counted rollouts",
        "pass@1",
        "pass@4",
        "reward/seat solver",
        "reward/correct",
        "error/SandboxError",
        "stop/completed",
        "100 / 20",
        "time/agent (mean s)",
        "1.235",
    ):
        assert row in text, row
    assert "metric/turns" in text and "time/setup" not in text


def _row(text: str, metric: str) -> str:
    """The value cell of one row of the rendered table."""
    line = next(line for line in text.splitlines() if f" {metric} " in line)
    return line.strip("│ ").split("│")[-1].strip()


def test_the_results_table_leaves_out_rows_that_say_nothing() -> None:
    text = _rendered({**BASE, "attempts": 4, "reward_mean": 1.0, "reward_stderr": 1e-17})
    assert "attempts" not in text and "infra failures" not in text
    assert _row(text, "reward (mean of per-rollout reward)") == "1 ± 0"  # float noise: no spread
    empty = _rendered({**BASE, "reward_mean": None, "reward_stderr": None})
    assert _row(empty, "reward (mean of per-rollout reward)") == "-"
    assert _row(empty, "tokens in / out") == "100 / 20"


def _final(rows: list[dict[str, Any]]) -> pa.Table:
    names = ["error_type", "error_message", "error_phase", "task_key", "rollout_index"]
    return pa.table({n: [r.get(n) for r in rows] for n in names})


def test_the_first_error_of_each_type_phase_and_message_most_frequent_first() -> None:
    final = _final(
        [
            {"task_key": "a", "rollout_index": 0},
            {"error_type": "ToolError", "error_message": "t1", "task_key": "a", "rollout_index": 1},
            {
                "error_type": "SandboxError",
                "error_message": "  no\n space  ",
                "error_phase": "setup",
                "task_key": "b",
                "rollout_index": 0,
            },
            {"error_type": "SandboxError", "error_message": "later", "task_key": "c"},
            {
                "error_type": "AgentError",
                "error_message": None,
                "task_key": "d",
                "rollout_index": 2,
            },
        ]
    )
    examples = first_errors(final)
    # Two SandboxErrors in different phases with different messages are two ways of failing.
    assert [(e.type, e.phase, e.count) for e in examples] == [
        ("AgentError", None, 1),
        ("SandboxError", None, 1),
        ("SandboxError", "setup", 1),
        ("ToolError", None, 1),
    ]
    assert examples[2] == ErrorExample("SandboxError", 1, "no space", "setup", "b", 0)
    assert examples[0].message == "(no message)"
    twice = _final([{"error_type": "SandboxError", "error_message": m, "task_key": k}
                    for m, k in (("port 4101 busy", "x"), ("port 4102 busy", "y"))])  # fmt: skip
    assert [(e.count, e.task_key) for e in first_errors(twice)] == [(2, "x")]
    assert first_errors(final.slice(0, 0)) == []
    assert first_errors(final.slice(0, 1)) == []


def test_error_lines_name_each_cause_and_one_transcript_to_read() -> None:
    examples = [
        ErrorExample("SandboxError", 2, "no space", "setup", "task one", 1),
        ErrorExample("ToolError", 1, "t1", None, "b", 0),
    ]
    assert error_lines(examples, "/runs/my run") == [
        "errors (the first of each type, phase and message):",
        "  SandboxError x2 in setup: no space",
        "  ToolError x1: t1",
        "  one transcript: vfray show '/runs/my run' --task 'task one' --rollout 1",
    ]
    assert error_lines([], "/r") == []


# --- eval.log -----------------------------------------------------------------------------------


def _record(msg: str, level: int = logging.WARNING, name: str = "vfray.run") -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, None, None)


def test_the_console_shows_a_warning_once_per_logger_and_template() -> None:
    repeats = runlog.RepeatFilter()
    shown = [
        repeats.filter(r)
        for r in (
            _record("retrying %s"),
            _record("retrying %s"),  # the same template, another rollout
            _record("retrying %s", name="vfray.other"),
            _record("retrying %s", level=logging.ERROR),
            _record("retrying %s", level=logging.ERROR),  # errors always show
            _record("something else"),
        )
    ]
    assert shown == [True, False, True, True, True, True]
    assert repeats.suppressed == 1


def test_records_before_the_folder_is_known_are_flushed_into_eval_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runlog, "MAX_BUFFERED", 3)
    handler = runlog.RunLog()
    for i in range(5):
        handler.handle(_record(f"early {i}", logging.INFO))
    path = handler.open(tmp_path / "run")
    assert path == tmp_path / "run" / "eval.log"
    assert handler.open(tmp_path / "run") == path  # the same folder: nothing reopened
    handler.handle(_record("late", logging.INFO))
    handler.close()  # a library closing every handler mid-run: still writing
    handler.handle(_record("after close", logging.INFO))
    handler.finish()
    lines = path.read_text().splitlines()
    # The oldest records went to keep the buffer bounded.
    assert [line.rsplit(": ", 1)[1] for line in lines] == [
        "early 2",
        "early 3",
        "early 4",
        "late",
        "after close",
    ]
    assert " INFO vfray.run: " in lines[0]
    again = runlog.RunLog()
    again.open(tmp_path / "run")  # a resumed run appends
    again.handle(_record("resumed", logging.INFO))
    again.finish()
    assert path.read_text().splitlines()[-1].endswith("resumed")


def test_a_log_file_that_cannot_be_written_remembers_why_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    handler = runlog._LogFile(tmp_path / "eval.log")
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError:
            handler.handleError(_record("x"))
        assert handler.failed is not None and handler.failed.errno == errno.ENOSPC
    finally:
        handler.close()
    assert capsys.readouterr().err == ""


def test_capturing_a_run_log_restores_the_root_logger(tmp_path: Path) -> None:
    root = logging.getLogger()
    console = logging.StreamHandler()
    root.addHandler(console)
    previous = root.level
    root.setLevel(logging.WARNING)
    try:
        with runlog.capture_run_log() as handler:
            assert handler in root.handlers and root.level == logging.INFO
            assert console.level == logging.WARNING  # the terminal stays as quiet
            logging.getLogger("vfray.test").info("to the file only")
            handler.open(tmp_path)
        assert handler not in root.handlers
        assert (root.level, console.level) == (logging.WARNING, logging.NOTSET)
        assert "to the file only" in (tmp_path / "eval.log").read_text()
    finally:
        root.removeHandler(console)
        root.setLevel(previous)


# --- stops around a run -------------------------------------------------------------------------


@pytest.fixture
def sigterm() -> Iterator[None]:
    """guarded_run installs its SIGTERM handler; the test process gets its own back."""
    before = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, before)


def test_start_up_says_what_the_silence_is(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert lifecycle.startup_message(EvalConfig(taskset="t", backend="local")) is None
    assert lifecycle.startup_message(EvalConfig(taskset="t")) == "starting a local Ray (5-20 s)…"
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert "cluster at 10.0.0.1:6379" in (lifecycle.startup_message(EvalConfig(taskset="t")) or "")
    config = EvalConfig(taskset="t", address="ray://head:10001")
    assert lifecycle.startup_message(config) == "connecting to the Ray cluster at ray://head:10001…"


class _RayTaskError(OSError):
    """Like Ray's wrapper of an actor's error: an OSError subclass carrying ``cause``."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__("actor died")
        self.cause = cause


def _chained() -> BaseException:
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as inner:
            raise RuntimeError("write failed") from inner
    except RuntimeError as outer:
        return outer


@pytest.mark.parametrize(
    ("exc", "full"),
    [
        (OSError(errno.ENOSPC, "No space left on device"), True),
        (OSError("[Errno 28] No space left on device: '/runs/x'"), True),  # errno lost
        (OSError(errno.EACCES, "Permission denied"), False),
        (ValueError("bad"), False),
        (_chained(), True),
        (_RayTaskError(OSError(errno.ENOSPC, "full")), True),
        (ExceptionGroup("many", [ValueError("a"), OSError(errno.ENOSPC, "full")]), True),
        (pa.ArrowIOError("IOError: No space left on device"), True),
    ],
)
def test_a_full_disk_is_found_behind_any_wrapping(exc: BaseException, full: bool) -> None:
    assert (lifecycle.disk_full(exc) is not None) is full


def test_a_cycle_of_causes_ends() -> None:
    a, b = ValueError("a"), ValueError("b")
    a.__context__, b.__context__ = b, a
    assert lifecycle.disk_full(a) is None


def test_ctrl_c_stops_with_the_resume_command(sigterm: None, tmp_path: Path) -> None:
    folder = tmp_path / "my run"
    with pytest.raises(lifecycle.RunStopped) as info, lifecycle.guarded_run([folder]):
        raise KeyboardInterrupt
    assert info.value.code == 130
    assert str(info.value).splitlines() == [
        "interrupted; rows written so far are kept",
        f"run folder: {folder}",
        f"resume with: vfray resume '{folder}'",
    ]
    with pytest.raises(lifecycle.RunStopped) as early, lifecycle.guarded_run([]):
        raise KeyboardInterrupt
    assert str(early.value).endswith("no rollout had started")


def test_sigterm_during_ray_start_up_is_a_stop_and_other_exits_pass(sigterm: None) -> None:
    with pytest.raises(lifecycle.RunStopped) as info, lifecycle.guarded_run([]):
        raise SystemExit(signal.SIGTERM)
    assert info.value.code == 143 and str(info.value).startswith("terminated (SIGTERM) while")
    with pytest.raises(SystemExit), lifecycle.guarded_run([]):
        raise SystemExit(3)


def test_a_full_disk_is_one_line_with_or_without_a_run_folder(
    sigterm: None, tmp_path: Path
) -> None:
    with pytest.raises(lifecycle.RunStopped) as info, lifecycle.guarded_run([tmp_path]):
        raise _chained()
    assert info.value.code == 1
    assert str(info.value) == (
        f"error: no space left on device while writing the run folder {tmp_path}; "
        f"free some space, then: vfray resume {tmp_path}"
    )
    with pytest.raises(lifecycle.RunStopped) as early, lifecycle.guarded_run([]):
        raise OSError(errno.ENOSPC, "No space left on device")
    assert str(early.value) == "error: no space left on device in the output folder"
    with pytest.raises(ValueError, match="not ours"), lifecycle.guarded_run([tmp_path]):
        raise ValueError("not ours")


def test_a_stop_prints_its_first_line_as_the_error(capsys: pytest.CaptureFixture[str]) -> None:
    code = lifecycle.print_stopped(lifecycle.RunStopped("interrupted\nrun folder: /r", 130))
    assert code == 130
    assert capsys.readouterr().err == "vfray: interrupted\nrun folder: /r\n"


# --- vfray validate's checks --------------------------------------------------------------------

ODD_TASKS = """
import vfray as vf
from typing import Any


class Data(vf.TaskData):
    n: int
    blob: Any = None


class Keyless(vf.Task[Data]):
    @property
    def key(self):
        raise RuntimeError("no key without a network")


class Slow(vf.Task[Data]):
    async def validate(self, runtime):
        import asyncio

        await asyncio.sleep(30)


class Checked(vf.Task[Data]):
    async def validate(self, runtime):
        result = await runtime.run(["sh", "-c", "test -d /definitely/not/here"])
        if not result.ok:
            raise FileNotFoundError("the fixture folder is missing\\nsecond line")


class Odd(vf.Taskset):
    def load(self):
        yield vf.Task(Data(prompt="ok", n=0))
        yield {"prompt": "a dict, not a task"}
        yield Keyless(Data(prompt="k", n=1))
        yield vf.Task(Data(prompt="t", n=2, blob=(1, 2)))  # a tuple comes back a list
        yield vf.Task(Data(prompt="o", n=3, blob=object()))
        raise OSError("the dataset server went away")


class Hooks(vf.Taskset):
    def load(self):
        yield Checked(Data(prompt="c", n=0))
        yield Slow(Data(prompt="s", n=1))
"""


def _problems(problems: list[Any]) -> list[tuple[Any, str, str]]:
    return [(p.index, p.check, p.message) for p in problems]


def test_every_problem_of_a_taskset_is_collected(tmp_path: Path) -> None:
    from vfray.cli.validate import collect

    path = tmp_path / "odd_tasks.py"
    path.write_text(ODD_TASKS)
    tasks, problems = collect(f"{path}:Odd", {}, limit=10)
    assert [t.data.n for t in tasks] == [0, 2]
    found = _problems(problems)
    assert found[0] == (1, "type", "yielded dict, not a vf.Task")
    assert found[1] == (2, "key", "RuntimeError: no key without a network")
    assert found[2][:2] == (3, "round-trip") and "changes through JSON" in found[2][2]
    # Data JSON cannot carry has no key either (the key hashes the data's JSON).
    assert found[3][:2] == (4, "key") and "Unable to serialize unknown type" in found[3][2]
    assert found[4] == (None, "load", "OSError: the dataset server went away")
    few, early = collect(f"{path}:Odd", {}, limit=1)  # the first task only: nothing wrong
    assert len(few) == 1 and early == []


async def test_validate_hooks_run_in_a_started_runtime_with_a_deadline(tmp_path: Path) -> None:
    from vfray.cli.validate import collect, validate_all

    path = tmp_path / "hook_tasks.py"
    path.write_text(ODD_TASKS)
    tasks, problems = collect(f"{path}:Hooks", {}, limit=10)
    assert problems == []
    found = _problems(await validate_all(tasks, "subprocess", {"root": str(tmp_path)}, 1.0))
    assert found == [
        (0, "validate", "FileNotFoundError: the fixture folder is missing"),
        (1, "validate", "timed out after 1 s"),
    ]
    assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == []  # every box was removed


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-n", "0"], "-n must be at least 1"),
        (["--runtime-options", "[1]"], "--runtime-options must be a JSON object, got list"),
        (["--taskset-args", "{bad"], "--taskset-args must be a JSON object: Expecting"),
        (["--runtime", "dockr"], "unknown runtime 'dockr'; did you mean 'docker'?"),
    ],
)
def test_bad_validate_arguments_are_usage_errors_before_any_work(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from vfray.cli.main import main

    assert main(["validate", "no-such-taskset-loaded", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"vfray: error: {message}") and "\n" not in err
