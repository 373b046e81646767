"""``vfray serve-model``: serve the scripted model, an OpenAI/Anthropic-compatible stand-in."""

from __future__ import annotations

import argparse
import socket
import sys
from typing import Any

from vfray.models.scripted.policies import POLICIES


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``serve-model`` on an ``argparse`` subparsers object; returns its parser."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "serve-model",
        help="serve the deterministic scripted model for tests and demos",
        description="Serve a deterministic OpenAI/Anthropic-compatible model on HTTP: "
        "/v1/chat/completions, /v1/responses, /v1/messages, /v1/models, /health.",
    )
    parser.add_argument("--policy", choices=POLICIES, default="echo", help="answering policy")
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on")
    parser.add_argument("--port", type=int, default=8001, help="port (0 picks a free one)")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds slept per call")
    parser.add_argument(
        "--accuracy", type=float, default=1.0, help="chance an arithmetic answer is right"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the wrong answers")
    parser.add_argument("--model-name", default="scripted", help="the name /v1/models lists")
    parser.add_argument(
        "--context-window", type=int, default=None, help="refuse longer requests (tokens)"
    )
    parser.set_defaults(run=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted (SIGINT/SIGTERM); prints the base URL once listening."""
    import uvicorn

    from vfray.models.scripted.server import ScriptedModel

    try:
        model = ScriptedModel(
            args.policy,
            latency=args.latency,
            accuracy=args.accuracy,
            seed=args.seed,
            model_name=args.model_name,
            context_window=args.context_window,
        )
    except ValueError as exc:
        print(f"vfray serve-model: {exc}", file=sys.stderr)
        return 2
    # Bind first so --port 0 can report the port it got. The explicit IPPROTO_TCP matters:
    # asyncio sets TCP_NODELAY only on sockets whose proto says TCP; without it every response
    # stalls ~40 ms on Nagle + delayed ACK.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args.host, args.port))
    except OSError as exc:
        print(
            f"vfray serve-model: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr
        )
        return 1
    host, port = sock.getsockname()[:2]
    print(f"scripted model ({args.policy}) serving at http://{host}:{port}/v1", flush=True)
    config = uvicorn.Config(model, log_level="warning", access_log=False, lifespan="off")
    uvicorn.Server(config).run(sockets=[sock])
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vfray")
    add_parser(parser.add_subparsers(required=True))
    return run(parser.parse_args(["serve-model", *(argv if argv is not None else sys.argv[1:])]))


if __name__ == "__main__":
    sys.exit(main())
