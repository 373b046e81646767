"""``vfray resume RUN_DIR``: re-run only the missing or errored rollouts of an earlier run,
with the configuration saved in its ``config.json``; no rollout is written twice."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from vfray.cli.eval import build_tasks, exit_code
from vfray.cli.lifecycle import (
    RunStopped,
    guarded_run,
    handle_stop_signals,
    print_stopped,
    startup_message,
)
from vfray.cli.preflight import check_output_dir
from vfray.cli.runlog import CONSOLE_REPEATS, capture_run_log
from vfray.cli.show import readable_run
from vfray.config import EvalConfig, format_validation_error
from vfray.errors import ConfigError
from vfray.task import Task

log = logging.getLogger("vfray.cli")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "resume", help="re-run missing or errored rollouts of a run folder"
    )
    parser.add_argument("run_dir", help="the run folder (holds config.json)")
    parser.add_argument("--no-progress", action="store_true", help="no live progress line")
    parser.add_argument("--address", help="Ray cluster address (default: local)")
    parser.add_argument(
        "--backend",
        choices=("ray", "local"),
        help="ray (a cluster, or a local Ray) or local (this process, no Ray); default: the "
        "run's own",
    )
    parser.set_defaults(run=run)
    return parser


def load_run_header(run_dir: Path) -> dict[str, Any]:
    header_path = run_dir / "config.json"
    if not header_path.exists():
        raise ConfigError(f"{run_dir} is not a vfray run folder (no config.json)")
    try:
        header: dict[str, Any] = json.loads(header_path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{header_path} is not valid JSON: {exc}") from exc
    if not isinstance(header.get("config"), dict):
        raise ConfigError(f"{header_path} has no 'config' section")
    return header


def missing_rollouts(run_dir: Path, tasks: Iterable[Task[Any]], n: int) -> int:
    """How many (task key, rollout index) pairs have no successful final row yet."""
    from vfray.run.results import RunResult

    final = RunResult(run_dir).final_traces
    done = {
        (key, index)
        for key, index, ok in zip(
            final.column("task_key").to_pylist(),
            final.column("rollout_index").to_pylist(),
            final.column("ok").to_pylist(),
            strict=True,
        )
        if ok
    }
    return sum(1 for task in tasks for index in range(n) if (task.key, index) not in done)


def episodes_to_rebuild(run_dir: Path, tasks: Iterable[Task[Any]], n: int) -> int:
    """How many groups have all n rollouts done but no current episode row (a crash between
    the trace and the episode flush). Also finishes a compaction an earlier run left undone."""
    from vfray.run.resume import load_resume_state

    states = load_resume_state(run_dir)
    return sum(
        1
        for task in tasks
        if (state := states.get(task.key)) is not None
        and state.rescore
        and all(index in state.done for index in range(n))
    )


def run(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir).absolute()
    header = load_run_header(run_dir)
    try:
        config = EvalConfig.model_validate(header["config"])
    except ValidationError as exc:
        raise ConfigError(f"{run_dir}/config.json: {format_validation_error(exc)}") from exc
    if args.address and args.backend == "local":
        raise ConfigError(
            f"--address {args.address!r} names a Ray cluster; --backend local runs without Ray "
            "(drop one of them)"
        )
    if args.backend == "local":
        config.backend, config.address = "local", None  # here, not on the run's cluster
    elif args.backend == "ray" or args.address:
        config.backend = "ray"
    if args.address:
        config.address = args.address
    n = int(header.get("rollouts_per_task", config.rollouts_per_task))
    # The group size the run was made with (the Python API passes it to Farm.run, not the
    # config): the tasks are built for it, group rewards included.
    config.rollouts_per_task = n
    tasks, _ = build_tasks(config)
    with readable_run(run_dir):
        todo = missing_rollouts(run_dir, tasks, n)
        rebuild = episodes_to_rebuild(run_dir, tasks, n)
    from vfray.cli.report import error_lines, print_errors, print_results
    from vfray.run.error_examples import first_errors
    from vfray.run.results import RunResult

    if todo == 0 and rebuild == 0:
        # Nothing to re-run: no Ray, no actors, just the table again.
        with readable_run(run_dir):
            result = RunResult(run_dir)
            summary = result.summary()
            errors = error_lines(first_errors(result.final_traces), str(run_dir))
        print("nothing to resume: every rollout already succeeded")
    else:
        from vfray.farm import Farm

        check_output_dir(str(run_dir))
        with capture_run_log(logging.DEBUG if args.verbose else logging.INFO) as run_log:
            run_log.open(run_dir)
            log.info(
                "vfray resume %s: %d rollouts to run, %d episode rows to rebuild",
                run_dir,
                todo,
                rebuild,
            )
            try:
                with guarded_run([run_dir]), readable_run(run_dir):
                    starting = startup_message(config)
                    if starting and not args.no_progress:
                        print(starting, file=sys.stderr, flush=True)
                    with Farm(config=config, progress=not args.no_progress) as farm:
                        result = farm.run(tasks, n, resume=run_dir, on_run_dir=_reinstall)
                    summary = result.summary()
                    errors = error_lines(first_errors(result.final_traces), str(run_dir))
            except RunStopped as stop:
                log.info("%s", stop)
                return print_stopped(stop)
            log.info("summary: %s", json.dumps(summary, sort_keys=True, default=str))
            for line in errors:
                log.info("%s", line)
    print_results(summary, title=run_dir.name)
    print_errors(errors)
    if CONSOLE_REPEATS.suppressed:
        print(
            f"({CONSOLE_REPEATS.suppressed} repeated warnings not shown here; all are in eval.log)"
        )
    print(f"run folder: {run_dir}")
    return exit_code(summary)


def _reinstall(_: Path) -> None:
    handle_stop_signals()  # ray.init (just before) installed its own
