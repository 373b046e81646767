"""``vfray show RUN_DIR``: the results table of a run again, or one rollout's transcript."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from vfray.errors import ConfigError


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "show", help="print a run's results, or one rollout's transcript"
    )
    parser.add_argument("run_dir", help="the run folder")
    parser.add_argument("--rollout", type=int, metavar="N", help="print the N-th rollout row")
    parser.set_defaults(run=run)
    return parser


def run(args: argparse.Namespace) -> int:
    # Imported here: the parser of every command is built on each `vfray` call.
    from rich.console import Console

    from vfray.cli.report import print_results
    from vfray.results import RunResult
    from vfray.traces.convert import table_to_traces

    run_dir = Path(args.run_dir)
    if not (run_dir / "traces").exists():
        raise ConfigError(f"{run_dir} has no traces/ folder: not a vfray run folder")
    result = RunResult(run_dir)
    if args.rollout is None:
        print_results(result.summary(), title=run_dir.name)
        print(f"run folder: {run_dir}")
        return 0
    table = result.final_traces
    if not 0 <= args.rollout < table.num_rows:
        raise ConfigError(f"--rollout must be in 0..{table.num_rows - 1}")
    trace = table_to_traces(table.slice(args.rollout, 1))[0]
    console = Console()
    console.print(
        f"[bold]task[/bold] {trace.task.key}  rollout {trace.rollout_index}"
        f"  attempt {trace.attempt}  reward {trace.reward}"
        f"  stop {trace.stop_condition.value if trace.stop_condition else '-'}"
    )
    for message in trace.messages:
        console.print(f"[bold cyan]{message.role}[/bold cyan]: {message.text}")
        for call in message.tool_calls or []:
            console.print(f"  [magenta]tool call[/magenta] {call}")
    for error in trace.errors:
        console.print(f"[red]{error.type}[/red] ({error.phase}): {error.message}")
    for name, record in trace.rewards.items():
        console.print(f"reward {name} = {record.value} (weight {record.weight})")
    return 0
