"""``vfray export RUN_DIR --format v1``: a run's final traces in verifiers v1's ``traces.jsonl``
format (:mod:`vfray.compat.v1.traces`), for v1 tooling; ``--format harbor``: the run as Harbor's
job folder (:mod:`vfray.compat.harbor_jobs`), for ``harbor view`` and Harbor's job tools."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from vfray.errors import ConfigError


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "export", help="write a run's traces in another framework's format"
    )
    parser.add_argument("run_dir", help="a run folder (holds traces/)")
    parser.add_argument(
        "--format",
        choices=["v1", "harbor"],
        default="v1",
        help="v1: verifiers v1 traces.jsonl; harbor: Harbor's job and trial result folders",
    )
    parser.add_argument(
        "-o",
        "--output",
        help="v1: file to write (default RUN_DIR/v1/traces.jsonl); harbor: the jobs folder "
        "the job folder goes in (default RUN_DIR/harbor)",
    )
    parser.set_defaults(run=run)
    return parser


def run(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    if not (run_dir / "traces").is_dir():
        if (run_dir / "config.json").is_file():
            raise ConfigError(
                f"{run_dir} has no rows yet (it stopped before its first rollout ended); "
                f"`vfray resume {run_dir}` runs it"
            )
        raise ConfigError(f"{run_dir} is not a run folder (no traces/ in it)")
    if args.format == "harbor":
        from vfray.compat.harbor_jobs import export_run as export_harbor

        path = export_harbor(run_dir, args.output)
        print(f"wrote {path} (harbor view {path.parent})")
        return 0
    from vfray.compat.v1.traces import export_run

    path = export_run(run_dir, args.output)
    print(f"wrote {path}")
    return 0
