"""``vfray resume RUN_DIR``: re-run only the missing or errored rollouts of an earlier run,
with the configuration saved in its ``config.json``; no rollout is written twice."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from vfray.cli.eval import build_tasks
from vfray.cli.report import print_results
from vfray.config import EvalConfig
from vfray.errors import ConfigError


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "resume", help="re-run missing or errored rollouts of a run folder"
    )
    parser.add_argument("run_dir", help="the run folder (holds config.json)")
    parser.add_argument("--no-progress", action="store_true", help="no live progress line")
    parser.add_argument("--address", help="Ray cluster address (default: local)")
    parser.set_defaults(run=run)
    return parser


def load_run_header(run_dir: Path) -> dict[str, Any]:
    import json

    header_path = run_dir / "config.json"
    if not header_path.exists():
        raise ConfigError(f"{run_dir} is not a vfray run folder (no config.json)")
    header: dict[str, Any] = json.loads(header_path.read_text())
    return header


def run(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    header = load_run_header(run_dir)
    config = EvalConfig.model_validate(header["config"])
    if args.address:
        config.address = args.address
    from vfray.farm import Farm

    with Farm(config=config, progress=not args.no_progress) as farm:
        result = farm.run(
            build_tasks(config), int(header.get("rollouts_per_task", 1)), resume=run_dir
        )
    summary = result.summary()
    print_results(summary, title=str(result.run_dir))
    return 1 if summary["rollouts"] and summary["ok"] == 0 else 0
