"""Harbor task folders run for real: the fixture tasks (tests/fixtures/harbor, each image
built FROM the offline Debian base image in the tests' own dockerd) with the ``oracle``
harness, a do-nothing agent (``null`` on the scripted echo model), ``vfray validate`` and the
Ray backend.

The ``network-setup-only`` task's Dockerfile fetches its seed from a server on the build host
(port 18734, served here; the runtime builds with ``build_network="host"``) while its agent,
``allow_internet = false``, must not reach that server."""

from __future__ import annotations

import asyncio
import http.server
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from vfray.config import EvalConfig
from vfray.run.environment import LocalEnvironment
from vfray.tasksets.harbor_tasks import HarborTask, HarborTaskset
from vfray.trace import Trace

FIXTURES = Path(__file__).parent / "fixtures" / "harbor"
SEED_PORT = 18734
SOLVABLE = {
    "edit-file", "python-bug", "vfray/multi-metric", "compose-sidecar", "vfray/multi-step",
    "network-setup-only", "prebuilt-image", "vfray/canary-instruction", "verifier-env",
    "tests-hidden", "verifier-user", "agent-user",
}  # fmt: skip


@pytest.fixture(scope="module")
def seed_server() -> Iterator[None]:
    class Seed(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"seed-from-setup")

        def log_message(self, *args: Any) -> None:
            pass

    try:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", SEED_PORT), Seed)
    except OSError as exc:
        pytest.skip(f"port {SEED_PORT} busy: {exc}")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def options(docker_url: str, debian_in_docker: str, seed_server: None) -> dict[str, Any]:
    """The docker runtime on the tests' engine, Dockerfile builds on the host's network."""
    return {"base_url": docker_url, "build_network": "host"}


def _tasks(*names: str) -> list[HarborTask]:
    tasks = list(HarborTaskset(str(FIXTURES)))
    return [t for t in tasks if not names or Path(t.data.task_dir).name in names]


async def _run(tasks: list[HarborTask], harness: str, options: dict[str, Any]) -> dict[str, Trace]:
    async with LocalEnvironment(
        model="scripted:echo", harness=harness, runtime="docker", runtime_options=options
    ) as env:
        traces = await asyncio.gather(*(env.rollout(t) for t in tasks))
    return {t.key: trace for t, trace in zip(tasks, traces, strict=True)}


def _artifact(trace: Trace, name: str) -> str:
    return next(a.content for a in trace.artifacts if a.name == name)


def test_the_oracle_solves_every_solvable_task(options: dict[str, Any]) -> None:
    traces = asyncio.run(_run(_tasks(), "oracle", options))
    for key in SOLVABLE:
        trace = traces[key]
        assert trace.errors == [], (key, trace.errors)
        assert trace.reward == 1.0, (key, trace.rewards, trace.notes)
    # The failures are typed, and on their own rollouts only.
    (broken,) = traces["broken-dockerfile"].errors
    assert (broken.type, broken.phase) == ("SandboxError", "image")
    assert "cannot build image" in broken.message and "\n" not in broken.message
    (late,) = traces["verifier-timeout"].errors
    assert (late.type, late.phase) == ("PhaseTimeoutError", "finalize")
    assert "exceeded its timeout of 2s" in late.message
    assert traces["verifier-timeout"].reward is None
    # During the agent's phase the box had no /tests (the verifier found its own there).
    hidden = traces["tests-hidden"]
    assert _artifact(hidden, "agent/probe.txt") == "absent\n"
    assert " tests" not in _artifact(hidden, "agent/root-listing.txt")
    # Several named values of reward.json become several rewards; reward.txt one.
    metrics = traces["vfray/multi-metric"].rewards
    assert {k: r.value for k, r in metrics.items()} == {
        "reward": 1.0, "parsed": 1.0, "status": 1.0, "count": 1.0
    }  # fmt: skip
    assert traces["vfray/multi-metric"].task.data["metadata"]["keywords"] == ["json", "metrics"]
    steps = traces["vfray/multi-step"]
    assert {k: r.value for k, r in steps.rewards.items()} == {
        "reward": 1.0, "01-create": 1.0, "02-extend": 1.0
    }  # fmt: skip
    assert {"verifier/01-create/test.sh.log", "verifier/02-extend/test.sh.log"} <= {
        a.name for a in steps.artifacts
    }
    # Step 02's workdir/setup.sh ran before its agent (its verifier needs it, with its own
    # env), and that agent found no /tests nor reward of step 01's verifier.
    assert _artifact(steps, "agent/step2-tests.txt") == "absent\n"
    edit = traces["edit-file"]
    assert _artifact(edit, "agent/notes.txt") == "edited greeting.txt\n"  # /logs/agent kept
    assert any("build_timeout_sec" in note for note in edit.notes)
    # [agent] user: the agent's program ran as it, and vfray's dir in the box was its own.
    assert _artifact(traces["agent-user"], "agent/whoami.txt") == "agent\n"


def test_a_do_nothing_agent_scores_zero(options: dict[str, Any]) -> None:
    tasks = _tasks(
        "edit-file", "python-bug", "multi-metric", "multi-step", "verifier-env", "agent-user"
    )
    traces = asyncio.run(_run(tasks, "null", options))
    for key, trace in traces.items():
        assert trace.errors == [], (key, trace.errors)
        assert trace.reward == 0.0, (key, trace.rewards)
        assert trace.calls, key  # the model was asked, and said nothing useful
    # Step 01 was verified (and failed) below its min_reward: step 02 was never given.
    steps = traces["vfray/multi-step"]
    assert len(steps.segments) == 1
    assert {k: r.value for k, r in steps.rewards.items()} == {
        "reward": 0.0, "01-create": 0.0, "02-extend": 0.0
    }  # fmt: skip
    assert any("below min_reward 1" in note for note in steps.notes), steps.notes


def _vfray(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    # Wide enough that the problems table keeps each message on one line.
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent), "COLUMNS": "400"}
    return subprocess.run(
        [sys.executable, "-m", "vfray", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=400,
    )


def test_validate_lists_the_tasks_the_oracle_does_not_solve(
    options: dict[str, Any], tmp_path: Path
) -> None:
    manifest = tmp_path / "registry.json"
    names = ("edit-file", "broken-dockerfile", "verifier-timeout")
    tasks = [{"name": n, "path": str(FIXTURES / n)} for n in names]
    manifest.write_text(json.dumps({"name": "three", "tasks": tasks}))
    done = _vfray(
        "validate", f"harbor:{manifest}", "--runtime-options", json.dumps(options), cwd=tmp_path
    )
    out = " ".join(done.stdout.split())
    assert done.returncode == 1, done.stdout + done.stderr
    assert "3 tasks checked in runtime 'docker': 2 problem(s)" in out
    assert "broken-dockerfile" in out and "verifier-timeout" in out
    assert "SandboxError in image" in out and "PhaseTimeoutError in finalize" in out
    assert "edit-file" not in out.split("problems", 1)[1]


@pytest.mark.usefixtures("ray_local")
def test_the_ray_backend_runs_harbor_tasks(options: dict[str, Any], tmp_path: Path) -> None:
    from vfray.farm import Farm

    config = EvalConfig.model_validate({"env": {"runtime": {"type": "docker", "options": options}}})
    tasks = _tasks("edit-file", "multi-metric", "broken-dockerfile")
    with Farm(
        "scripted:echo",
        config=config,
        harness="oracle",
        backend="ray",
        output_dir=str(tmp_path),
        progress=False,
    ) as farm:
        result = farm.run(tasks)
    rows = result.traces.to_pylist()
    by_key = {row["task_key"]: row for row in rows}
    assert set(by_key) == {"edit-file", "vfray/multi-metric", "broken-dockerfile"}
    assert by_key["edit-file"]["ok"] and by_key["vfray/multi-metric"]["ok"]
    assert by_key["edit-file"]["reward"] == 1.0 == by_key["vfray/multi-metric"]["reward"]
    assert not by_key["broken-dockerfile"]["ok"]
