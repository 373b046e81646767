"""Running a Harbor verifier in the box the agent used: ``tests/`` uploaded to ``/tests`` only
now (the agent never saw it), ``tests/test.sh`` run under its own timeout, and the score read
from ``/logs/verifier/reward.txt`` (one number) or ``reward.json`` (named numbers).

Internal: importable, but not the public API; names here may move.
"""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path

from vfray.errors import PhaseTimeoutError, SandboxError, TaskError
from vfray.runtimes.base import Runtime
from vfray.trace import AgentArtifact, Trace

TESTS = "/tests"
SOLUTION = "/solution"
VERIFIER_LOGS = "/logs/verifier"
AGENT_LOGS = "/logs/agent"
STEP_RESULTS = "/logs/vfray-steps"
"""Where each step's parsed rewards are kept in the box, for the reward hooks."""
MAX_AGENT_LOG_FILES = 50


async def upload_dir(runtime: Runtime, source: Path, dest: str) -> None:
    """Copy the host folder ``source`` into the box at ``dest`` (modes kept)."""
    for path in sorted(source.rglob("*")):
        if path.is_file():
            rel = path.relative_to(source).as_posix()
            mode = path.stat().st_mode & 0o777
            await runtime.write(f"{dest}/{rel}", path.read_bytes(), mode=mode)


async def shell(runtime: Runtime, script: str, timeout: float = 60.0) -> None:
    done = await runtime.run(["/bin/sh", "-c", script], timeout=timeout)
    if not done.ok:
        said = " ".join((done.stderr or done.stdout).split())[-300:]
        raise SandboxError(f"{script[:80]!r} failed in the box: {said}")


def parse_rewards(text_file: bytes | None, json_file: bytes | None) -> dict[str, float]:
    """The verifier's rewards: ``reward.txt`` as ``{"reward": value}``, else ``reward.json``'s
    named numbers. Raises :class:`TaskError` when neither holds a number."""
    if text_file is not None and text_file.strip():
        try:
            value = float(text_file.decode(errors="replace").strip())
        except ValueError as exc:
            raise TaskError(f"reward.txt holds no number: {text_file[:80]!r}") from exc
        return {"reward": value}
    if json_file is not None and json_file.strip():
        try:
            raw = json.loads(json_file)
        except json.JSONDecodeError as exc:
            raise TaskError(f"reward.json is not JSON: {exc}") from exc
        if not isinstance(raw, dict):
            raise TaskError("reward.json must be an object of named numbers")
        values = {
            str(k): float(v)
            for k, v in raw.items()
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
        }
        if not values:
            raise TaskError("reward.json has no numeric value")
        return values
    raise TaskError(f"the verifier wrote no {VERIFIER_LOGS}/reward.txt or reward.json")


async def _maybe_read(runtime: Runtime, path: str) -> bytes | None:
    try:
        return await runtime.read(path)
    except (SandboxError, OSError):
        return None


def primary(rewards: Mapping[str, float]) -> float:
    """The one reward of a verifier's result: its ``reward``, else the mean of its values."""
    if "reward" in rewards:
        return rewards["reward"]
    return sum(rewards.values()) / len(rewards)


async def verify(
    runtime: Runtime,
    tests: Sequence[Path],
    *,
    timeout: float,
    env: Mapping[str, str],
    user: str | None,
    trace: Trace,
    label: str = "verifier",
) -> dict[str, float]:
    """Upload ``tests`` (later folders override earlier ones' files) to ``/tests`` and run
    ``/tests/test.sh`` as ``user`` (None: the box's user); its rewards. A verifier past
    ``timeout`` is a :class:`PhaseTimeoutError`; missing or unreadable rewards a
    :class:`TaskError`; a runtime that cannot run it as ``user`` a :class:`SandboxError`."""
    # /logs/verifier open to any user, as Harbor's empty_dirs(chmod=True) leaves it: the
    # verifier's user is often not the box's.
    await shell(
        runtime,
        f"rm -rf {TESTS} {VERIFIER_LOGS} && mkdir -p {TESTS} {VERIFIER_LOGS} "
        f"&& chmod 777 {VERIFIER_LOGS}",
    )
    for folder in tests:
        if folder.is_dir():
            await upload_dir(runtime, folder, TESTS)
    argv = ["bash", f"{TESTS}/test.sh"]
    try:
        done = await runtime.run(argv, dict(env), timeout=timeout, user=user)
    except SandboxError as exc:
        raise SandboxError(f"{label}: {exc}") from exc
    as_user = f" as {user}" if user is not None else ""
    log = f"$ {shlex.join(argv)}{as_user} (exit {done.exit_code})\n{done.stdout}\n{done.stderr}"
    trace.artifacts.append(AgentArtifact.of_bytes(f"{label}/test.sh.log", log.encode()))
    if done.timed_out:
        raise PhaseTimeoutError(f"{label}: tests/test.sh exceeded its timeout of {timeout:g}s")
    return parse_rewards(
        await _maybe_read(runtime, f"{VERIFIER_LOGS}/reward.txt"),
        await _maybe_read(runtime, f"{VERIFIER_LOGS}/reward.json"),
    )


async def keep_agent_logs(runtime: Runtime, trace: Trace) -> None:
    """The files under ``/logs/agent`` onto the trace as artifacts (``agent/<path>``)."""
    tree = await runtime.read_tree(AGENT_LOGS, MAX_AGENT_LOG_FILES)
    if tree is not None:
        for rel, content in sorted(tree.items()):
            trace.artifacts.append(AgentArtifact.of_bytes(f"agent/{rel}", content))
        return
    found = await runtime.run(
        ["/bin/sh", "-c", f"find {AGENT_LOGS} -type f 2>/dev/null | head -n {MAX_AGENT_LOG_FILES}"],
        timeout=60,
    )
    for path in found.stdout.split("\n"):
        if path.startswith(AGENT_LOGS + "/"):
            raw = await _maybe_read(runtime, path)
            if raw is not None:
                name = "agent/" + path[len(AGENT_LOGS) + 1 :]
                trace.artifacts.append(AgentArtifact.of_bytes(name, raw))


async def save_step(runtime: Runtime, name: str, rewards: Mapping[str, float] | None) -> None:
    """Keep one step's rewards in the box (None: the step was not passed or not reached)."""
    await runtime.write(f"{STEP_RESULTS}/{name}.json", json.dumps(rewards).encode())


async def read_step(runtime: Runtime, name: str) -> dict[str, float] | None:
    raw = await _maybe_read(runtime, f"{STEP_RESULTS}/{name}.json")
    if raw is None:
        return None
    value = json.loads(raw)
    return {str(k): float(v) for k, v in value.items()} if isinstance(value, dict) else None
