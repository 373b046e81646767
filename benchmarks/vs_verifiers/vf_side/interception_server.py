# mypy: disable-error-code="import-not-found,import-untyped,misc,untyped-decorator"
# (verifiers ships no type information; this file runs in its virtualenv, not ours.)
"""Serve verifiers v1's own ``InterceptionServer`` with N registered rollout sessions.

Runs inside the verifiers virtualenv (never imports vfray). Speaks the protocol of
``benchmarks/interception.py``'s served processes: one JSON line ``{"url", "secrets"}`` on
stdout once listening, then serves until stdin closes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

from verifiers.v1.clients import ModelContext
from verifiers.v1.configs.agent import AgentConfig
from verifiers.v1.configs.client import EvalClientConfig
from verifiers.v1.interception.server import InterceptionServer
from verifiers.v1.session import RolloutSession
from verifiers.v1.task import TaskData
from verifiers.v1.trace import AgentInfo, Trace, TraceTask


async def serve(upstream: str, sessions: int) -> None:
    os.environ.setdefault("VFBENCH_KEY", "x")
    ctx = ModelContext(
        model="bench",
        client=EvalClientConfig(base_url=upstream, api_key_var="VFBENCH_KEY"),
    )
    agent = AgentConfig(model="bench")
    server = InterceptionServer()
    async with server:
        secrets = []
        for i in range(sessions):
            data = TaskData(idx=i, prompt=f"session {i}")
            task = TraceTask(type="Task", data=data, key=str(i), hash=str(i))
            trace = Trace(task=task, agent=AgentInfo(config=agent))
            model_secret, _ = server.register(RolloutSession(ctx=ctx, trace=trace))
            secrets.append(model_secret)
        print(json.dumps({"url": server.base_url, "secrets": secrets}), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--sessions", type=int, required=True)
    args = parser.parse_args()
    asyncio.run(serve(args.upstream, args.sessions))


if __name__ == "__main__":
    main()
