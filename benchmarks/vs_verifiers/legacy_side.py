"""Classic verifiers environments (``verifiers.load_environment(id, **args)``: SingleTurnEnv,
ToolEnv, MultiTurnEnv) scored by verifiers' own rollout and by ``vfray eval`` through its legacy
bridge, in ONE process of the side-by-side virtualenv with verifiers' classic stack importable,
against the same scripted model server. Prints, as JSON, which ``verifiers`` was imported and
both sides' rollouts per case (:class:`vfray.compat.v1.traces.Outcome` fields).

    python legacy_side.py OUT_DIR ENV_ID CASES_JSON

``CASES_JSON``: ``[[kind, policy, n], ...]``; ``kind`` is the env's ``load_environment`` argument.
Run by tests/test_v1_legacy.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import json
import os
import sys
from pathlib import Path
from typing import Any


def _dump(message: Any) -> dict[str, Any]:
    raw = dict(message.model_dump() if hasattr(message, "model_dump") else message)
    # run_rollout's output keeps each tool call as its JSON text.
    calls = [json.loads(c) if isinstance(c, str) else c for c in raw.get("tool_calls") or []]
    return {**raw, "tool_calls": calls}


async def _theirs(env_id: str, kind: str, url: str, n: int) -> list[dict[str, Any]]:
    """verifiers' own: load_environment, then run_rollout (rollout + rubric) per eval row."""
    import verifiers as vf
    from openai import AsyncOpenAI

    from vfray.compat.v1.traces import plain_message

    env = vf.load_environment(env_id, kind=kind)
    client = vf.OpenAIChatCompletionsClient(AsyncOpenAI(base_url=url, api_key="unused"))
    rows = []
    for row in env.get_eval_dataset(n=n):
        out = await env.run_rollout(dict(row), client, "scripted", {})
        messages = [plain_message(_dump(m)) for m in [*out["prompt"], *out["completion"]]]
        rows.append(
            {
                "key": str(row["example_id"]),
                "reward": out["reward"],
                "scores": dict(out["metrics"]),
                "stop_condition": out["stop_condition"],
                "messages": messages,
                "errors": [] if out.get("error") is None else [str(out["error"])],
            }
        )
    return rows


def _ours(out: str, env_id: str, kind: str, url: str, n: int) -> list[dict[str, Any]]:
    from vfray.cli.main import main as vfray_main
    from vfray.compat.v1.traces import export_run, read_v1_traces

    argv = [env_id, "--env.taskset.kind", kind, "-n", str(n), "-m", "scripted"]
    argv += ["--client.base-url", url, "--client.api-key-var", "VFK", "--no-push", "--no-rich"]
    argv += ["--env.agent.runtime.type", "subprocess", "-o", f"{out}/{kind}", "--backend", "local"]
    log = io.StringIO()
    with contextlib.redirect_stdout(log):
        rc = vfray_main(["eval", *argv])
    if rc != 0:
        raise SystemExit(f"vfray eval {kind} exited {rc}: {log.getvalue()[-2000:]}")
    [run_dir] = Path(out, kind).glob("*/*")
    from vfray.run.results import final_rows
    from vfray.traces.convert import table_to_traces
    from vfray.traces.io import read_traces

    # What only vfray's own trace keeps: the tool calls and the notes, by task key.
    kept = {
        t.task.key: {
            "tool_calls": [[c.server, c.name, c.arguments, c.result] for c in t.tool_calls],
            "notes": [n for n in t.notes if n.startswith("verifiers'")],
        }
        for t in table_to_traces(final_rows(read_traces(run_dir / "traces")))
    }
    rows = []
    for o in map(dataclasses.asdict, read_v1_traces(export_run(run_dir))):
        rows.append(
            {
                "key": o["key"],
                "reward": o["reward"],
                "scores": {**o["rewards"], **o["metrics"]},
                "stop_condition": o["stop_condition"],
                "messages": list(o["messages"]),
                "errors": list(o["errors"]),
                "trace": kept[o["key"]],
            }
        )
    return rows


def _refused(out: str, env_id: str, kind: str, flags: list[str]) -> dict[str, Any]:
    from vfray.cli.main import main as vfray_main

    argv = [env_id, "--env.taskset.kind", kind, "-m", "scripted", "--no-push", "--no-rich"]
    argv += flags
    said = io.StringIO()
    with contextlib.redirect_stderr(said), contextlib.redirect_stdout(io.StringIO()):
        rc = vfray_main(["eval", *argv, "-o", f"{out}/{kind}", "--backend", "local"])
    return {"rc": rc, "stderr": said.getvalue().strip().splitlines()}


def _slow(out: str, env_id: str, kind: str, url: str) -> list[str]:
    from vfray.cli.main import main as vfray_main
    from vfray.compat.v1.traces import export_run, read_v1_traces

    argv = [env_id, "--env.taskset.kind", kind, "-n", "1", "-m", "scripted"]
    argv += ["--client.base-url", url, "--client.api-key-var", "VFK", "--no-push", "--no-rich"]
    argv += ["--env.agent.runtime.type", "subprocess", "--env.agent.timeout.rollout", "0.5"]
    with contextlib.redirect_stdout(io.StringIO()):
        vfray_main(["eval", *argv, "-o", f"{out}/{kind}-slow", "--backend", "local"])
    [run_dir] = Path(out, f"{kind}-slow").glob("*/*")
    return [e for o in read_v1_traces(export_run(run_dir)) for e in o.errors]


def _off_main_thread(env_id: str, kind: str) -> str:
    import importlib
    import threading

    from vfray.compat.v1._legacy import _ENVS, classic_env

    module = importlib.import_module(env_id.replace("-", "_"))
    said: list[str] = []
    _ENVS.clear()  # built afresh, not the one the eval above left

    def build() -> None:
        try:
            said.append(type(classic_env(module, {"kind": kind})).__name__)
        except Exception as exc:
            said.append(f"{type(exc).__name__}: {exc}")

    thread = threading.Thread(target=build)
    thread.start()
    thread.join()
    return said[0]


def main(argv: list[str]) -> int:
    out, env_id, cases = argv[0], argv[1], json.loads(argv[2])
    from vfray.models.scripted.server import scripted_server

    os.environ["VFK"] = "unused"
    result: dict[str, Any] = {}
    for kind, policy, n, *flags in cases:
        if policy == "refused":  # what vfray says, and its exit code, for an env it refuses
            result[" ".join([kind, *flags])] = _refused(out, env_id, kind, flags)
            continue
        if policy == "slow":  # a model slower than the agent's time: vfray's errors
            with scripted_server("arithmetic", latency=3.0) as url:
                result[f"{kind}@slow"] = _slow(out, env_id, kind, url)
            continue
        if policy == "thread":  # built off the main thread, as a Ray actor builds it
            result[f"{kind}@thread"] = _off_main_thread(env_id, kind)
            continue
        with scripted_server(policy) as url:
            theirs = asyncio.run(_theirs(env_id, kind, url, n))
            ours = _ours(out, env_id, kind, url, n)
        result[kind] = {"theirs": theirs, "ours": ours}
    import verifiers

    print(json.dumps({"verifiers": verifiers.__file__, "cases": result}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
