"""How the viewer names things (issue 27, item 15), over real sockets: tasks without an
explicit key (a 64-character content hash) shown by a short key and their prompt, runs
labelled by model and harness, the model-calls table inside a box that scrolls, and
``vfray view outputs/`` listing the runs inside the folder."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.view_runs import make_trace, write_run
from vfray.endpoints.serving import serve_in_thread
from vfray.traces.io import traces_to_table, write_traces
from vfray.view import create_app


def hashed_run(folder: Path) -> tuple[Path, list[str]]:
    """A run of 3 tasks whose keys are their data's SHA-256, as for tasks given no key."""
    traces, keys = [], []
    for t in range(3):
        key = hashlib.sha256(f"task {t}".encode()).hexdigest()
        keys.append(key)
        for r in range(2):
            trace = make_trace(t + 1, r)
            trace.task = trace.task.model_copy(update={"key": key})
            traces.append(trace)
    write_run(folder)  # the header and episodes; its traces are replaced below
    for part in (folder / "traces").iterdir():
        part.unlink()
    write_traces(traces_to_table(traces), folder / "traces")
    return folder, keys


@pytest.fixture
def hashed(tmp_path: Path) -> Iterator[tuple[httpx.Client, list[str]]]:
    folder, keys = hashed_run(tmp_path / "run")
    with serve_in_thread(create_app([folder])) as url, httpx.Client(base_url=url) as c:
        yield c, keys


def test_hash_keyed_tasks_show_a_short_key_and_their_prompt(
    hashed: tuple[httpx.Client, list[str]],
) -> None:
    client, keys = hashed
    for path in ("/run/0/rollouts", "/run/0/episodes"):
        page = client.get(path).text
        for t, key in enumerate(keys):
            assert f"What is {t + 1} + {t + 1}?" in page, path
            assert f">{key[:12]}…<" in page, path  # shown short, the whole key in the tooltip
            assert f">{key}<" not in page, path
    episode = client.get("/run/0/episode", params={"task": keys[0]}).text
    assert "What is 1 + 1?" in episode and f"episode {keys[0][:12]}…" in episode


def test_runs_are_labelled_by_model_and_harness(tmp_path: Path) -> None:
    a, b = write_run(tmp_path / "a"), write_run(tmp_path / "b")
    header = json.loads((b / "config.json").read_text())
    header["config"]["model"]["name"] = "gpt-4o-mini"
    header["config"]["env"]["harness"]["id"] = "codex"
    (b / "config.json").write_text(json.dumps(header))
    with serve_in_thread(create_app([a, b])) as url, httpx.Client(base_url=url) as c:
        index = c.get("/").text
        assert "scripted:bash · bash · run-synthetic" in index
        assert "gpt-4o-mini · codex · run-synthetic" in index
        assert "gpt-4o-mini · codex" in c.get("/run/1").text
        compare = c.get("/compare", params={"a": 0, "b": 1}).text
        assert "scripted:bash · bash" in compare and "gpt-4o-mini · codex" in compare


def test_the_calls_table_scrolls_inside_its_box(tmp_path: Path) -> None:
    folder = write_run(tmp_path / "run")
    with serve_in_thread(create_app([folder])) as url, httpx.Client(base_url=url) as c:
        listed = c.get("/run/0/rollouts", params={"status": "ok"}).text
        link = re.findall(r"href='(/run/0/rollout/[0-9a-f]+)'", listed)[0]
        page = c.get(link).text
        css = c.get("/static/view.css").text
    assert "<div class=scroll><table class='calls'>" in page
    assert re.search(r"\.scroll\s*\{[^}]*overflow-x:\s*auto", css)


def test_view_of_an_outputs_folder_lists_the_runs_inside(tmp_path: Path) -> None:
    outputs = tmp_path / "outputs"
    write_run(outputs / "sums--scripted_bash--bash" / "20261201-000000-aaaaaa")
    write_run(outputs / "sums--scripted_bash--bash" / "20261202-000000-bbbbbb")
    (outputs / "notes").mkdir()  # not a run: left out
    proc = subprocess.Popen(
        [sys.executable, "-m", "vfray.cli.main", "view", str(outputs), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        url = re.search(r"http://127\.0\.0\.1:\d+/", line)
        assert url is not None, line + (proc.stderr.read() if proc.stderr else "")
        index = httpx.get(url.group(0), timeout=30).text
        assert "20261201-000000-aaaaaa" in index and "20261202-000000-bbbbbb" in index
        assert "/run/1" in index and "/run/2" not in index and "notes" not in index
        assert "not a vfray run folder" not in index
    finally:
        proc.terminate()
        proc.wait(timeout=30)
