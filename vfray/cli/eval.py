"""``vfray eval``: check what can be checked before Ray (config, taskset, output folder, model
endpoint), run the taskset on the farm (a local Ray unless an address is given), and print the
results table with the first error of each type; the run folder holds config.json, Parquet
traces/episodes and eval.log."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vfray.cli.lifecycle import (
    RunStopped,
    guarded_run,
    handle_stop_signals,
    print_stopped,
    startup_message,
)
from vfray.cli.overrides import add_config_options, collect_overrides, parse_free_overrides
from vfray.cli.preflight import check_api_key_var, preflight, resolve_output_dir
from vfray.cli.runlog import CONSOLE_REPEATS, capture_run_log
from vfray.config import EvalConfig, load_config
from vfray.errors import ConfigError, TasksetError, VfrayError
from vfray.taskset import Taskset
from vfray.tasksets import load_for_run, task_type_of

if TYPE_CHECKING:
    from vfray.run.spec import RunSpec

log = logging.getLogger("vfray.cli")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "eval",
        # No prefix matching: "--env.max_turn" must not silently mean "--env.max_turns".
        allow_abbrev=False,
        help="run a taskset and print results",
        description="Run TASKSET (a built-in id, module:Class or file.py:Class). Options override "
        "@config.toml, which overrides VFRAY_* environment variables.",
    )
    parser.add_argument("taskset", nargs="?", help="taskset id or import path")
    parser.add_argument("config", nargs="?", help="@path/to/config.toml")
    parser.add_argument("--dry-run", action="store_true", help="print the resolved config")
    parser.add_argument("--no-progress", action="store_true", help="no live progress line")
    parser.add_argument(
        "--no-preflight",
        action="store_true",
        help="skip the one-token call that checks --base-url (when only the cluster reaches it)",
    )
    add_config_options(parser)
    # Leftover --section.key VALUE pairs under open sections (options dicts, sampling).
    parser.set_defaults(
        run=run, accepts_extra=True, known_options=list(parser._option_string_actions)
    )
    return parser


def resolve(args: argparse.Namespace) -> EvalConfig:
    toml = None
    positional = [p for p in (args.taskset, args.config) if p]
    if positional[:1] == ["@"] and len(positional) == 2:  # v1's `eval @ config.toml`
        positional = [f"@{positional[1]}"]
    extra = list(getattr(args, "extra", None) or [])
    mapped = _v1_mapping(args, positional, extra)
    if mapped is not None:
        positional, extra = [], mapped.rest
    overrides = parse_free_overrides(extra, getattr(args, "known_options", ()))
    overrides.update(collect_overrides(args))
    for item in positional:
        if item.startswith("@"):
            toml = item[1:]
        elif item.endswith(".toml"):
            raise ConfigError(f"to read a config file, write @{item}")
        elif "taskset" in overrides:
            raise ConfigError(f"taskset given twice: {overrides['taskset']!r} and {item!r}")
        else:
            overrides["taskset"] = item
    if mapped is not None:
        # vfray's own flags, given alongside v1 ones, win over the mapped values.
        overrides = {**mapped.overrides, **overrides}
        toml = mapped.toml
    return load_config(toml, overrides)


def _v1_mapping(args: argparse.Namespace, positional: list[str], extra: list[str]) -> Any:
    """A v1 eval (a v1 taskset id or path, a v1 eval TOML or vf-eval flags) mapped onto vfray's
    config, or None for a plain vfray eval. Imported only when something looks like v1."""
    from vfray.cli._v1 import map_v1_eval, might_be_v1

    if not might_be_v1(positional, extra):
        return None
    mapped = map_v1_eval(positional, extra)
    if mapped is None:
        return None
    args.dry_run = args.dry_run or mapped.dry_run
    args.verbose = getattr(args, "verbose", False) or mapped.verbose
    args.no_progress = args.no_progress or mapped.no_progress
    if args.dry_run:
        for line in mapped.lines:
            print(line, file=sys.stderr)
    args.v1_lines = mapped.lines
    return mapped


def build_tasks(config: EvalConfig) -> tuple[Taskset[Any], str | None]:
    """The run's taskset (shuffled and cut to -n), and a note when a built-in default was
    adapted (a built-in's group reward left out with -r 1)."""
    taskset, note = load_for_run(
        config.taskset, config.taskset_args, config.rollouts_per_task, dict(config.env.scoring)
    )
    if config.shuffle:
        if config.num_tasks is not None and taskset.is_infinite:
            taskset = taskset.head(config.num_tasks)
        taskset = taskset.shuffle(config.seed)
    if config.num_tasks is not None:
        taskset = taskset.head(config.num_tasks)
    return taskset, note


def check(config: EvalConfig) -> tuple[Taskset[Any], str | None, RunSpec]:
    """Everything that can be refused without Ray and without the network: the taskset, and
    the run spec (the endpoint and its key, harness, runtime, their pairing)."""
    from vfray.run.spec import resolve_run

    tasks, note = build_tasks(config)
    return tasks, note, resolve_run(config)


def _first_task(tasks: Taskset[Any]) -> Any:
    """The taskset's first task (None when it has none), or one line when it cannot be built."""
    try:
        return next(iter(tasks), None)
    except VfrayError:
        raise
    except Exception as exc:
        raise TasksetError(
            f"taskset {tasks.name!r} failed building its first task: {type(exc).__name__}: {exc}"
        ) from exc


def run(args: argparse.Namespace) -> int:
    config = resolve(args)
    # Before anything prints or logs the config (--dry-run, eval.log, config.json).
    check_api_key_var(config.model.api_key_var)
    notes = [resolve_output_dir(config)]
    tasks, note, spec = check(config)
    notes.append(note)
    for line in notes:
        if line:
            print(line, file=sys.stderr)
    if args.dry_run:
        print(json.dumps(config.model_dump(mode="json"), indent=2))
        return 0
    # A group reward with one rollout per task, or a first task whose image the runtime cannot
    # run: refused here, not after Ray started (the farm checks every task as it reaches it).
    spec.check_task_type(task_type_of(tasks), config.rollouts_per_task)
    first = _first_task(tasks)
    if first is not None:
        spec.check_task(first)
    preflight(config, endpoint=not args.no_preflight)
    from vfray.farm import Farm

    run_dir: list[Path] = []
    with capture_run_log(logging.DEBUG if args.verbose else logging.INFO) as run_log:
        for line in notes:
            if line:
                log.info("%s", line)
        log.info("command: vfray %s", " ".join(sys.argv[1:]))
        for line in getattr(args, "v1_lines", ()):
            log.info("%s", line)
        log.info("config: %s", json.dumps(config.model_dump(mode="json"), sort_keys=True))

        def named(path: Path) -> None:
            run_dir.append(path)
            run_log.open(path)
            handle_stop_signals()  # ray.init (just before) installed its own

        try:
            with guarded_run(run_dir):
                starting = startup_message(config)
                if starting and not args.no_progress:
                    print(starting, file=sys.stderr, flush=True)
                with Farm(config=config, progress=not args.no_progress) as farm:
                    result = farm.run(
                        tasks, config.rollouts_per_task, name=tasks.name, on_run_dir=named
                    )
                summary = result.summary()
        except RunStopped as stop:
            log.info("%s", stop)
            return print_stopped(stop)
        log.info("summary: %s", json.dumps(summary, sort_keys=True, default=str))
        from vfray.cli.report import error_lines
        from vfray.run.error_examples import first_errors

        errors = error_lines(first_errors(result.final_traces), str(result.run_dir))
        for line in errors:
            log.info("%s", line)
    from vfray.cli.report import print_errors, print_results  # rich: only once the run is over

    title = f"{config.taskset} · {config.model.name} · {config.env.harness.id}"
    print_results(summary, title=title)
    print_errors(errors)
    if CONSOLE_REPEATS.suppressed:
        print(
            f"({CONSOLE_REPEATS.suppressed} repeated warnings not shown here; all are in eval.log)"
        )
    print(f"run folder: {result.run_dir}")
    return exit_code(summary)


def exit_code(summary: dict[str, Any]) -> int:
    """1 only when every rollout failed; partial failures are data, not a failed command."""
    return 1 if summary["rollouts"] and summary["ok"] == 0 else 0
