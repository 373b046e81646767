"""The results table printed at the end of a run and by ``vfray show``."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table


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
    table.add_row("reward", reward)
    for key in sorted(k for k in summary if k.startswith("pass@")):
        table.add_row(key, _fmt(summary[key]))
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


def print_results(summary: dict[str, Any], title: str = "results") -> None:
    Console().print(results_table(summary, title))
