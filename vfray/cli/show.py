"""``vfray show RUN_DIR``: the results table of a run again, or the transcripts of rollouts
picked by rollout index (``--rollout N``) and task key (``--task KEY``)."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vfray.errors import ConfigError

if TYPE_CHECKING:
    import pyarrow as pa

SHOWN_KEYS = 8
"""Task keys listed when a choice is ambiguous."""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "show",
        allow_abbrev=False,
        help="print a run's results, or rollout transcripts",
        description="Without options: the results table. --rollout N selects rollout index N "
        "(0..r-1) of a task (the last attempt), --task KEY selects the task by its key; "
        "a task's rollouts all share its key, so with several tasks give --task too.",
    )
    parser.add_argument("run_dir", help="the run folder")
    parser.add_argument(
        "--rollout",
        type=int,
        metavar="N",
        help="rollout index N (0..r-1) of the task, as in the traces' rollout_index column",
    )
    parser.add_argument(
        "--task", metavar="KEY", help="the task's key (task_key); alone: all its rollouts"
    )
    parser.set_defaults(run=run)
    return parser


@contextmanager
def readable_run(run_dir: Path) -> Iterator[None]:
    """A damaged Parquet file in the run folder is one error line naming the folder."""
    import pyarrow as pa

    from vfray.cli.lifecycle import disk_full

    try:
        yield
    except pa.ArrowException as exc:
        if disk_full(exc) is not None:
            raise
        message = " ".join(str(exc).split())[:300]
        raise ConfigError(
            f"cannot read the run folder {run_dir}: {type(exc).__name__}: {message}"
        ) from exc


def select(final: pa.Table, rollout: int | None, task: str | None) -> pa.Table:
    """The final rows with that rollout index and/or task key; an ambiguous or empty choice
    is an error that lists what exists."""
    import pyarrow.compute as pc

    keys = list(dict.fromkeys(final.column("task_key").to_pylist()))
    rows = final
    if task is not None:
        rows = rows.filter(pc.equal(rows.column("task_key"), task))
        if rows.num_rows == 0:
            raise ConfigError(f"no task with key {task!r}; keys: {_some(keys)}")
    if rollout is not None:
        indexes = sorted(set(rows.column("rollout_index").to_pylist()))
        rows = rows.filter(pc.equal(rows.column("rollout_index"), rollout))
        if rows.num_rows == 0:
            span = f"{indexes[0]}..{indexes[-1]}" if indexes else "none"
            raise ConfigError(f"--rollout must be a rollout index in {span}, got {rollout}")
        if task is None and rows.num_rows > 1:
            raise ConfigError(
                f"rollout {rollout} exists for {rows.num_rows} tasks: pick one with --task KEY "
                f"(keys: {_some(rows.column('task_key').to_pylist())})"
            )
    return rows


def _some(keys: list[str]) -> str:
    shown = ", ".join(shlex.quote(k) for k in keys[:SHOWN_KEYS])
    return shown + (f", … ({len(keys)} in all)" if len(keys) > SHOWN_KEYS else "")


def run(args: argparse.Namespace) -> int:
    # Imported here: the parser of every command is built on each `vfray` call.
    from rich.console import Console

    from vfray.cli.report import error_lines, print_errors, print_results
    from vfray.run.error_examples import first_errors
    from vfray.run.results import RunResult
    from vfray.traces.convert import table_to_traces

    run_dir = Path(args.run_dir).absolute()
    if not (run_dir / "traces").exists() and not (run_dir / "config.json").is_file():
        raise ConfigError(f"{run_dir} has no traces/ folder: not a vfray run folder")
    result = RunResult(run_dir)
    with readable_run(run_dir):
        final = result.final_traces
        if args.rollout is None and args.task is None:
            summary = result.summary()
            print_results(summary, title=run_dir.name)
            print_errors(error_lines(first_errors(final), str(run_dir)))
            print(f"run folder: {run_dir}")
            return 0
        traces = table_to_traces(select(final, args.rollout, args.task))
    console = Console()
    for trace in sorted(traces, key=lambda t: t.rollout_index):
        console.print(
            f"[bold]task[/bold] {trace.task.key}  rollout {trace.rollout_index}"
            f"  attempt {trace.attempt}  reward {trace.reward}"
            f"  stop {trace.stop_condition.value if trace.stop_condition else '-'}",
            highlight=False,
        )
        for message in trace.messages:
            console.print(f"[bold cyan]{message.role}[/bold cyan]: ", end="")
            console.print(message.text, markup=False, highlight=False)
            for call in message.tool_calls or []:
                console.print(f"  [magenta]tool call[/magenta] {call}")
        for error in trace.errors:
            console.print(f"[red]{error.type}[/red] ({error.phase}): ", end="")
            console.print(error.message, markup=False, highlight=False)
        for name, record in trace.rewards.items():
            console.print(f"reward {name} = {record.value} (weight {record.weight})")
    return 0
