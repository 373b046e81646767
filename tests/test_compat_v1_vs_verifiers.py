"""The same v1 taskset packages and the same ``vf-eval`` flags, run by verifiers 0.4.0 (PyPI, in
its own virtualenv) and by ``vfray eval``, on the same scripted model: rewards, metrics, stop
conditions and transcripts per task must be identical, except for the differences the
compatibility table (docs/guides/v1.md) lists (each asserted here as measured); and verifiers
itself reads vfray's exported traces.

- ``v1cmp``: scoring (weighted, keyed), ``runtime.run`` / ``run_uv_script`` in scoring, trace /
  request / response stops, group-style scoring via v1's own mechanism (``--env.id best-of-n``:
  ``Env.finalize`` over the siblings), and the hooks where the two differ (a sync hook, a
  raising hook, a ``@stop`` returning a non-bool);
- ``v1tools``: a task's own toolset, called by the ``bash`` harness under v1's tool names;
- ``v1user``: ``--env.id user-sim``, a second scripted model playing the user.

Each side runs at the same time (verifiers in a subprocess, vfray in this process): the
toolset's verifiers run spends most of its time starting processes. Skipped when PyPI is
unreachable.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from agent_tools import need_registry

from vfray.cli.main import main
from vfray.compat.v1.traces import Outcome, export_run, read_v1_traces
from vfray.models.scripted.server import scripted_server
from vfray.runtimes.provision import ToolSpec, ensure_tool

PACKAGES = Path(__file__).parent / "v1_tasksets"
VERIFIERS = ToolSpec(name="verifiers", kind="pypi", package="verifiers", version="0.4.0")


@dataclass(frozen=True)
class Verifiers:
    """verifiers 0.4.0's bin dir and the environment its processes run in."""

    bin: Path
    uv_dir: Path
    env: dict[str, str]


@pytest.fixture(scope="module")
def verifiers(tmp_path_factory: pytest.TempPathFactory) -> Verifiers:
    need_registry("pypi")
    found = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
    if not os.access(found, os.X_OK):
        pytest.skip("uv is not installed (pip install uv): verifiers' harnesses need it")
    uv_dir = tmp_path_factory.mktemp("uvbin")
    (uv_dir / "uv").symlink_to(found)
    vf_bin = Path(ensure_tool(VERIFIERS).executable("python")).parent
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    env.update(
        PATH=f"{vf_bin}{os.pathsep}{uv_dir}{os.pathsep}/usr/bin:/bin",
        PYTHONPATH=str(PACKAGES),
        VFK="unused",
    )
    return Verifiers(vf_bin, uv_dir, env)


@pytest.fixture
def vfray_side(verifiers: Verifiers, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process as vfray's side: the packages importable, uv on the boxes' PATH."""
    monkeypatch.setenv("VFK", "unused")
    monkeypatch.setenv("PATH", f"{verifiers.uv_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.syspath_prepend(str(PACKAGES))
    yield


def _run_both(
    verifiers: Verifiers, out: Path, flags: list[str], policies: list[str]
) -> tuple[list[Outcome], list[Outcome], Path, Path]:
    """Run ``flags`` (``{url0}``, ``{url1}`` ... for one scripted server per policy) with
    vf-eval and with vfray eval at once; their rollouts, verifiers' traces.jsonl and vfray's
    export."""
    with ExitStack() as stack:
        urls = {f"url{i}": stack.enter_context(scripted_server(p)) for i, p in enumerate(policies)}
        argv = [f.format(**urls) for f in flags]
        theirs = subprocess.Popen(
            [str(verifiers.bin / "vf-eval"), *argv, "-o", str(out / "v1")],
            env=verifiers.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            ours = main(["eval", *argv, "-o", str(out / "vfray"), "--backend", "local"])
            _, err = theirs.communicate(timeout=900)
        finally:
            if theirs.poll() is None:
                theirs.kill()
                theirs.wait()
    assert theirs.returncode == 0, err[-2000:]
    assert ours == 0
    [v1_file] = (out / "v1").glob("*/traces.jsonl")
    [run_dir] = (out / "vfray").glob("*/*")
    exported = export_run(run_dir)
    # Both files name the env as v1 does (`<env>+<taskset>` when an env is paired), and hold
    # the same episodes: one per rollout, per best-of-n group, per game of an env's seats.
    assert _env_ids(exported) == _env_ids(v1_file)
    assert _episode_sizes(exported) == _episode_sizes(v1_file)
    return read_v1_traces(v1_file), read_v1_traces(exported), v1_file, exported


def _env_ids(path: Path) -> set[str]:
    return {json.loads(line)["env"]["id"] for line in path.read_text().splitlines() if line}


def _episode_sizes(path: Path) -> list[int]:
    return sorted(len(json.loads(line)["traces"]) for line in path.read_text().splitlines() if line)


def _grouped(outcomes: list[Outcome]) -> dict[str, list[tuple[Any, ...]]]:
    by_key: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
    for o in outcomes:
        by_key[o.key].append((o.rewards, o.metrics, o.stop_condition, o.reply, o.completion))
    return {k: sorted(v, key=json.dumps) for k, v in by_key.items()}


def _flags(package: str, *more: str) -> list[str]:
    return [
        package,
        "-m",
        "scripted",
        "--client.base-url",
        "{url0}",
        "--client.api-key-var",
        "VFK",
        *more,
        "--no-push",
        "--no-rich",
    ]


@pytest.mark.slow
@pytest.mark.usefixtures("vfray_side")
def test_verifiers_and_vfray_score_the_same_v1_taskset_identically(
    verifiers: Verifiers, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = _flags(
        "v1cmp",
        "--env.agent.harness.id",
        "null",
        "--env.agent.runtime.type",
        "subprocess",
        "--env.id",
        "best-of-n",
        "--env.n",
        "2",
        "--env.taskset.odd",
        "true",
    )
    theirs, ours, _, exported = _run_both(verifiers, tmp_path, flags, ["arithmetic"])
    capsys.readouterr()
    same = [o for o in theirs if o.idx is not None and o.idx < 6]
    assert len(_grouped(theirs)) == 9 and all(len(v) == 2 for v in _grouped(theirs).values())
    assert _grouped([o for o in ours if o.idx is not None and o.idx < 6]) == _grouped(same)
    _assert_odd_rows_differ_as_listed(theirs, ours)
    # Whole transcripts are the same, but for a request stop: v1 records the refused request's
    # messages, vfray does not (the table's @stop row).
    for o in ours:
        if o.idx is not None and o.idx < 6:
            [v1_said] = {json.dumps(t.messages) for t in same if t.key == o.key}
            if o.stop_condition == "halt_request":
                assert json.loads(v1_said) == [{"role": "user", "content": "halt: What is 2 + 2?"}]
                assert o.messages == ()
            else:
                assert json.dumps(o.messages) == v1_said, o.key
    # verifiers' own model reads vfray's export, and finds the rewards vfray recorded (v1's,
    # on the rows where the two agree: asserted above).
    read = (
        "import sys, json, verifiers.v1 as vf\n"
        "rows = [[t.task.key, t.reward, t.stop_condition] for line in open(sys.argv[1])"
        " for t in vf.WireEpisode.model_validate_json(line).traces]\n"
        "print(json.dumps(sorted(rows)))"
    )
    check = subprocess.run(
        [str(verifiers.bin / "python"), "-c", read, str(exported)],
        env=verifiers.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert check.returncode == 0, check.stderr[-2000:]
    expected = sorted([o.key, o.reward, o.stop_condition] for o in ours)
    assert json.loads(check.stdout) == expected


def _assert_odd_rows_differ_as_listed(theirs: list[Outcome], ours: list[Outcome]) -> None:
    """v1cmp's ODD_ROWS (idx 6, 7, 8), as the table in docs/guides/v1.md says they differ."""
    scored = {"correct": 1.0, "has_reply": 1.0, "even": 1.0}
    for v1, mine in zip(
        sorted((o for o in theirs if o.idx in (6, 7, 8)), key=lambda o: o.idx or 0),
        sorted((o for o in ours if o.idx in (6, 7, 8)), key=lambda o: o.idx or 0),
        strict=True,
    ):
        assert v1.key == mine.key and mine.errors == ()
        assert mine.rewards == scored and mine.metrics["turns"] == 1.0
        if v1.idx == 6:  # a sync @metric: v1 fails the task's whole scoring; vfray runs it
            assert "TypeError" in v1.errors[0] and mine.metrics["reply_len"] == 1.0
        if v1.idx == 7:  # a raising @metric: v1 fails every score; vfray only that hook's
            assert "ValueError: this hook fails on purpose" in v1.errors[0]
            assert mine.metrics["fails"] is None
        if v1.idx in (6, 7):
            # a failed keyed reward is one None under its hook's name in v1
            assert v1.rewards == {"correct": None, "parts": None}
            assert {k: v for k, v in v1.metrics.items() if k not in ("best", "pass_at_n")} == {
                k: None for k in mine.metrics if k not in ("best", "pass_at_n")
            }
            assert v1.stop_condition == mine.stop_condition == "agent_completed"
        if v1.idx == 8:  # a @stop returning a str: v1 fails the rollout; vfray goes on
            assert (v1.stop_condition, v1.rewards) == ("task_error", {})
            assert "@stop must return bool, got str" in v1.errors[0]
            assert mine.stop_condition == "agent_completed"
        # best-of-n reads what each side scored: the failed attempts reach no threshold in v1.
        assert (v1.metrics["pass_at_n"], mine.metrics["pass_at_n"]) == (0.0, 1.0)


@pytest.mark.slow
@pytest.mark.usefixtures("vfray_side")
def test_a_v1_tasks_toolset_is_called_and_scored_the_same_on_both(
    verifiers: Verifiers, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = _flags(
        "v1tools", "--env.agent.harness.id", "bash", "--env.agent.runtime.type", "subprocess"
    )
    theirs, ours, _, _ = _run_both(verifiers, tmp_path, flags, ["agent"])
    capsys.readouterr()
    assert [o.errors for o in theirs] == [(), ()]
    assert _grouped(ours) == _grouped(theirs)
    # What both did: the tool, under v1's name, called with the plan's argument; its result in
    # the reply the reward reads.
    for outcome in theirs:
        call, result, answer = outcome.completion
        [asked] = call["tool_calls"]
        assert asked["name"] == "doubler_double"
        assert (result["role"], result["content"]) == ("tool", str(2 * asked["arguments"]["x"]))
        assert answer["content"] == f"Done. {result['content']}"
        assert outcome.rewards == {"doubled": 1.0} and outcome.metrics == {"turns": 2.0}
    # The harnesses differ in their system prompt: v1's bash frames a coding agent, vfray's
    # sends the task's prompt alone.
    assert {o.messages[0]["content"][:40] for o in theirs} == {
        "You are a coding agent. You have access t"[:40]
    }
    assert {o.messages[0]["role"] for o in ours} == {"user"}


USER_FLAGS = [
    "--env.id",
    "user-sim",
    "--env.user.model",
    "scripted",
    "--env.user.client.type",
    "eval",
    "--env.user.client.base-url",
    "{url1}",
    "--env.user.client.api-key-var",
    "VFK",
    "--env.user.runtime.type",
    "subprocess",
    "--env.assistant.harness.id",
    "null",
    "--env.assistant.runtime.type",
    "subprocess",
]


@pytest.mark.slow
@pytest.mark.usefixtures("vfray_side")
def test_user_sim_plays_the_same_conversation_and_scores_on_both(
    verifiers: Verifiers, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    theirs, ours, _, _ = _run_both(
        verifiers, tmp_path, _flags("v1user", *USER_FLAGS), ["arithmetic", "user"]
    )
    capsys.readouterr()

    def by_seat(outcomes: list[Outcome]) -> dict[tuple[int | None, str], Outcome]:
        return {(o.idx, o.agent): o for o in outcomes}

    v1, vfray = by_seat(theirs), by_seat(ours)
    assert sorted(v1) == sorted(vfray) == [(i, s) for i in (0, 1) for s in ("assistant", "user")]
    for seat in v1:
        mine, want = vfray[seat], v1[seat]
        # Same conversation on each seat, turn by turn.
        assert mine.messages == want.messages, seat
        assert mine.reply == want.reply
    for idx in (0, 1):
        mine, want = vfray[(idx, "assistant")], v1[(idx, "assistant")]
        assert (mine.rewards, mine.metrics) == (want.rewards, want.metrics)
        assert mine.reward == want.reward
        assert want.rewards == {"correct": 1.0}
    # The known differences (docs/guides/v1.md's table, user-sim row), as measured:
    for seat, want in v1.items():
        mine = vfray[seat]
        # an interaction the env closes: v1 `user_closed`; vfray's seat ended by the game.
        assert (want.stop_condition, mine.stop_condition) == ("user_closed", "agent_completed")
        if seat[1] == "user":
            # the user's task has no scoring, on both: each seat is scored by the task it played.
            assert (want.rewards, want.metrics) == ({}, {}) == (mine.rewards, mine.metrics)
    # task keys: v1 keys each seat by the row it played (the assistant's with its prompt
    # nulled, the user's persona task); vfray keys every seat by the taskset's row.
    rows = {o.idx: o.key for o in ours}
    for idx in (0, 1):
        assert vfray[(idx, "user")].key == vfray[(idx, "assistant")].key == rows[idx]
        assert v1[(idx, "assistant")].key != rows[idx]
        assert v1[(idx, "user")].key not in (rows[idx], v1[(idx, "assistant")].key)
