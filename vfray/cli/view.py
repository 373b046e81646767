"""``vfray view RUN_DIR [RUN_DIR…]``: serve a read-only web viewer of run folders on
127.0.0.1 (``--host`` to share it) and print its URL; it follows runs still being written."""

from __future__ import annotations

import argparse
import contextlib
import threading
from pathlib import Path
from typing import Any

from vfray.errors import ConfigError

DEFAULT_PORT = 8266
"""Next to Ray's dashboard (8265), so one port-forward habit covers both."""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "view",
        allow_abbrev=False,
        help="look at runs in the browser",
        description="Serve a web viewer of run folders: summary, rollouts (filter, sort, "
        "search), each rollout's conversation, episodes, and two runs compared task by task. "
        "Read-only; a run still being written is followed.",
    )
    parser.add_argument(
        "run_dirs",
        nargs="+",
        metavar="RUN_DIR",
        help="run folders, or folders holding runs (outputs/ lists every run in it)",
    )
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1; 0.0.0.0 shares it, e.g. on a cluster head)",
    )
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0: any)"
    )
    parser.set_defaults(run=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from vfray.endpoints.serving import serve_in_thread
    from vfray.view import create_app
    from vfray.view.runs import expand_runs

    folders = [Path(p).absolute() for p in args.run_dirs]
    missing = [str(p) for p in folders if not p.is_dir()]
    if missing:
        raise ConfigError(f"no such folder: {', '.join(missing)}")
    # A folder of runs (``outputs/``) stands for the runs inside it.
    folders = [run for folder in folders for run in expand_runs(folder)]
    # Read before the URL is printed: the first page then opens at once.
    app = create_app(folders, warm=True)
    with contextlib.ExitStack() as stack:
        try:
            url = stack.enter_context(serve_in_thread(app, args.host, args.port))
        except OSError as exc:
            raise ConfigError(
                f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc} "
                "(another program has the port? pick one with --port, or --port 0)"
            ) from exc
        print(f"vfray view: {url}/  (Ctrl-C to stop)", flush=True)
        threading.Event().wait()
    return 0
