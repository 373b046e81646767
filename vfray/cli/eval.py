"""``vfray eval``: run a taskset on the farm (a local Ray unless an address is given) and print
the results table; the run folder holds config.json, Parquet traces/episodes and eval.log."""

from __future__ import annotations

import argparse
import json
from typing import Any

from vfray.cli.overrides import add_config_options, collect_overrides
from vfray.cli.report import print_results
from vfray.config import EvalConfig, load_config
from vfray.errors import ConfigError
from vfray.taskset import Taskset
from vfray.tasksets import load_taskset


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "eval",
        help="run a taskset and print results",
        description="Run TASKSET (a built-in id, module:Class or file.py:Class). Options override "
        "@config.toml, which overrides VFRAY_* environment variables.",
    )
    parser.add_argument("taskset", nargs="?", help="taskset id or import path")
    parser.add_argument("config", nargs="?", help="@path/to/config.toml")
    parser.add_argument("--dry-run", action="store_true", help="print the resolved config")
    parser.add_argument("--no-progress", action="store_true", help="no live progress line")
    add_config_options(parser)
    parser.set_defaults(run=run)
    return parser


def resolve(args: argparse.Namespace) -> EvalConfig:
    toml = None
    positional = [p for p in (args.taskset, args.config) if p]
    overrides = collect_overrides(args)
    for item in positional:
        if item.startswith("@"):
            toml = item[1:]
        elif "taskset" in overrides:
            raise ConfigError(f"taskset given twice: {overrides['taskset']!r} and {item!r}")
        else:
            overrides["taskset"] = item
    return load_config(toml, overrides)


def build_tasks(config: EvalConfig) -> Taskset[Any]:
    taskset = load_taskset(config.taskset, config.taskset_args)
    if config.shuffle:
        if config.num_tasks is not None and taskset.is_infinite:
            taskset = taskset.head(config.num_tasks)
        taskset = taskset.shuffle(config.seed)
    if config.num_tasks is not None:
        taskset = taskset.head(config.num_tasks)
    return taskset


def run(args: argparse.Namespace) -> int:
    config = resolve(args)
    if args.dry_run:
        print(json.dumps(config.model_dump(mode="json"), indent=2))
        return 0
    tasks = build_tasks(config)
    from vfray.farm import Farm

    with Farm(config=config, progress=not args.no_progress) as farm:
        result = farm.run(tasks, config.rollouts_per_task, name=config.taskset)
    summary = result.summary()
    print_results(summary, title=str(result.run_dir))
    print(f"run folder: {result.run_dir}")
    return 1 if summary["rollouts"] and summary["ok"] == 0 else 0
