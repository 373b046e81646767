"""The results table printed at the end of a run and by ``vfray show``, and the first message
of each error type under it (the cause, not just a count)."""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from vfray.run.error_examples import ErrorExample

if TYPE_CHECKING:
    pass

REWARD_LABEL = "reward (mean of per-rollout reward)"
"""Each rollout's ``reward`` is the weighted sum of its rewards, group rewards included; the
table and the live progress line both show the mean of it."""


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def results_table(summary: dict[str, Any], title: str = "results") -> Table:
    table = Table(title=title, show_header=True, header_style="bold")
    table.add_column("metric")
    table.add_column("value", justify="right")
    mean, err = summary.get("reward_mean"), summary.get("reward_stderr")
    # Float noise (identical rewards give a stderr of ~1e-17) would read as a real spread.
    spread = 0.0 if err is not None and abs(err) < 1e-9 else err
    reward = _fmt(mean) + (f" ± {spread:.3g}" if spread is not None else "")
    table.add_row("rollouts (ok / total)", f"{summary['ok']} / {summary['rollouts']}")
    if summary.get("attempts", 0) != summary.get("rollouts"):
        table.add_row("attempts (incl. retried)", _fmt(summary.get("attempts")))
    table.add_row(REWARD_LABEL, reward)
    if summary.get("ok") != summary.get("rollouts") and summary.get("reward_mean_ok") != mean:
        # Errored rollouts can keep a reward: say what the ok ones scored beside it.
        table.add_row("reward (ok rollouts only)", _fmt(summary.get("reward_mean_ok")))
    counted = summary.get("reward_mean_counted")
    if counted is not None and counted != mean:
        # Rollouts that failed for infrastructure reasons carry no policy signal.
        table.add_row("reward (infra failures left out)", _fmt(counted))
    if summary.get("groups_untrainable"):
        table.add_row("groups with < 2 counted rollouts", _fmt(summary["groups_untrainable"]))
    for key in sorted(k for k in summary if k.startswith("pass@")):
        table.add_row(key, _fmt(summary[key]))
    for seat, value in summary.get("seats", {}).items():
        table.add_row(f"reward/seat {seat}", _fmt(value))
    for name, value in summary.get("rewards", {}).items():
        table.add_row(f"reward/{name}", _fmt(value))
    for name, value in summary.get("metrics", {}).items():
        table.add_row(f"metric/{name}", _fmt(value))
    for name, count in summary.get("errors", {}).items():
        table.add_row(f"error/{name}", str(count))
    for name, count in summary.get("stop_conditions", {}).items():
        table.add_row(f"stop/{name}", str(count))
    table.add_row("tokens in / out", f"{summary['input_tokens']} / {summary['output_tokens']}")
    for phase, seconds in summary.get("phase_seconds_mean", {}).items():
        if seconds is not None:
            table.add_row(f"time/{phase} (mean s)", f"{seconds:.3f}")
    return table


def error_lines(examples: list[ErrorExample], run_dir: str) -> list[str]:
    """Plain lines (for the terminal and for eval.log) naming each error type's first cause."""
    if not examples:
        return []
    lines = ["errors (the first of each type, phase and message):"]
    for e in examples:
        where = f" in {e.phase}" if e.phase else ""
        lines.append(f"  {e.type} x{e.count}{where}: {e.message}")
    e = examples[0]
    lines.append(
        f"  one transcript: vfray show {shlex.quote(run_dir)} --task {shlex.quote(e.task_key)}"
        f" --rollout {e.rollout_index}"
    )
    return lines


def print_results(summary: dict[str, Any], title: str = "results") -> None:
    Console().print(results_table(summary, title))


def print_errors(lines: list[str]) -> None:
    # markup/highlight off: messages are arbitrary text ("[Errno 111]" is not rich markup).
    console = Console()
    for line in lines:
        console.print(line, markup=False, highlight=False, soft_wrap=True)
