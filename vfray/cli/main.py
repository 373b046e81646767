"""Entry point of the ``vfray`` console script: builds the parser and dispatches subcommands."""

from __future__ import annotations

import argparse
import errno
import importlib
import logging
import sys
from collections.abc import Sequence

from vfray.errors import VfrayError

SUBCOMMANDS = ("eval", "resume", "show", "view", "validate", "init", "serve-model", "export")


# Each subcommand module imports its heavy dependencies (pyarrow, rich, Ray) inside its run
# function: building the parser imports every module, and `vfray eval` must not pay for
# `vfray show`'s imports before its first rollout.


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vfray", description="Run agentic LLM rollouts at scale, locally or on Ray."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        module = importlib.import_module(f"vfray.cli.{name.replace('-', '_')}")
        module.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The ``vfray`` command. ``argv`` None: this process is the command's own (the console
    script, ``python -m vfray``), tuned as vfray's processes are (:mod:`vfray.owned_process`);
    a caller passing ``argv`` keeps its process as it is."""
    from vfray.cli.overrides import normalize_bool_flags

    if argv is None:
        from vfray.owned_process import tune_owned_process

        tune_owned_process()

    parser = build_parser()
    args, extra = parser.parse_known_args(
        normalize_bool_flags(sys.argv[1:] if argv is None else argv)
    )
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    from vfray.cli.runlog import CONSOLE_REPEATS

    for handler in logging.getLogger().handlers:
        # The console handler basicConfig made, not a host's own (pytest's capture handler
        # lives on: a filter left there would hide later repeats from every other caller).
        console = type(handler) is logging.StreamHandler and handler.stream is sys.stderr
        if console and not args.verbose and CONSOLE_REPEATS not in handler.filters:
            handler.addFilter(CONSOLE_REPEATS)
    if args.command is None:
        parser.print_help()
        return 2
    if extra and not getattr(args, "accepts_extra", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.extra = extra
    try:
        code: int = args.run(args)
    except VfrayError as exc:
        print(f"vfray: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("vfray: interrupted", file=sys.stderr)
        return 130
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
        print(f"vfray: error: no space left on device ({exc.filename or exc})", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
