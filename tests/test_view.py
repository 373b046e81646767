"""``vfray view`` over real sockets: every page of a run folder written with vfray's own
writers (filters, sort, search, a rollout per branch with tool calls, reasoning, token ids on
demand, fields this viewer does not know), a run followed while written, two runs compared,
bad folders shown as pages, nothing written into the run folder, and the command itself."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pyarrow.parquet as pq
import pytest

from tests.view_runs import listing, make_trace, write_run
from vfray.endpoints.serving import serve_in_thread
from vfray.trace import Message, PhaseTiming, RewardRecord, Usage
from vfray.traces.io import traces_to_table, write_traces
from vfray.traces.schema import SCHEMA_VERSION_KEY
from vfray.view import create_app


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return write_run(tmp_path / "run", newer_fields=True)


@pytest.fixture
def client(run_dir: Path) -> Iterator[httpx.Client]:
    with serve_in_thread(create_app([run_dir])) as url, httpx.Client(base_url=url) as c:
        yield c


def rollout_links(html: str) -> list[str]:
    return re.findall(r"href='(/run/0/rollout/[0-9a-f]+)'", html)


def text(html: str) -> str:
    """The page's text, tags dropped (for asserting on what a reader sees)."""
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


def test_summary_shows_counts_reward_pass_at_k_errors_phases_and_config(
    client: httpx.Client,
) -> None:
    page = client.get("/run/0")
    assert page.status_code == 200
    seen = text(page.text)
    assert "run-synthetic" in seen and "scripted:bash" in seen
    assert "rollouts 12" in seen and "errored 2" in seen
    assert "reward mean ± stderr 0.6 ± " in seen and "pass@1" in seen and "pass@2" in seen
    assert "TaskError 2 setup fixture task-0000 is missing" in seen
    assert "correct" in seen and "reply_chars" in seen  # per-reward and per-metric breakdown
    assert "completed 10" in seen and "error 2" in seen  # stop conditions
    assert "boot" in seen and "agent" in seen  # time per phase
    assert "<svg class=hist" in page.text
    assert "/static/view.css" in page.text and "cdn" not in page.text.lower()


def test_summary_shows_the_counted_reward_mean_when_infra_failures_change_it(
    tmp_path: Path, client: httpx.Client
) -> None:
    # The synthetic run's infra failures (TaskError in setup) have no reward: both means agree,
    # and the counted one is not repeated.
    assert "infra failures left out" not in client.get("/run/0").text
    run = write_run(tmp_path / "retried", tasks=2)
    scored = make_trace(0, 1)  # a TaskError (infrastructure: the task's own code failed)...
    scored.attempt = 1  # ...retried, failing again but scored (as a failed finalize is)
    scored.rewards = {"correct": RewardRecord(value=1.0)}
    write_traces(traces_to_table([scored]), run / "traces")
    with serve_in_thread(create_app([run])) as url, httpx.Client(base_url=url) as c:
        seen = text(c.get("/run/0").text)
    # Rewards 1, 1 (the TaskError), 1, 0: the mean counts four, the counted mean three.
    assert "reward mean ± stderr 0.75 ± 0.25 " in seen
    assert "reward mean ± stderr, infra failures left out 0.667 ± 0.333 " in seen


def test_static_files_are_served_from_the_package(client: httpx.Client) -> None:
    for name in ("view.js", "view.css"):
        reply = client.get(f"/static/{name}")
        assert reply.status_code == 200 and len(reply.text) > 500


def test_rollout_list_filters_sorts_and_searches_transcripts(client: httpx.Client) -> None:
    every = client.get("/run/0/rollouts")
    assert "12 rollouts match" in every.text and len(rollout_links(every.text)) == 12
    # The unknown `lane` column a newer writer added is a column of the list, as it is.
    assert ">lane<" in every.text and "lane-1" in every.text
    errored = client.get("/run/0/rollouts", params={"status": "error"})
    assert "2 rollouts match" in errored.text
    assert (
        client.get("/run/0/rollouts", params={"status": "TaskError"}).text.count("fixture") == 0
    )  # the list shows the type, the message is on the rollout page
    assert "10 rollouts match" in client.get("/run/0/rollouts", params={"status": "ok"}).text
    assert "2 rollouts match" in client.get("/run/0/rollouts", params={"stop": "error"}).text
    assert "2 rollouts match" in client.get("/run/0/rollouts", params={"task": "TASK-0003"}).text
    assert "6 rollouts match" in client.get("/run/0/rollouts", params={"min_reward": "1"}).text
    # Search looks into the transcripts: tool results, reasoning, tool call arguments.
    found = client.get("/run/0/rollouts", params={"q": "expr 3 + 3"})
    assert "2 rollouts match" in found.text and "task-0003" in found.text
    assert "10 rollouts match" in client.get("/run/0/rollouts", params={"q": "USE BASH"}).text
    ordered = client.get("/run/0/rollouts", params={"sort": "reward", "dir": "desc"}).text
    rewards = re.findall(r"<td>(1|0|&ndash;)</td><td><span class=(?:ok|err)>", ordered)
    assert rewards == sorted(rewards, key=lambda r: {"1": 0, "0": 1, "&ndash;": 2}[r])
    assert rewards[0] == "1" and rewards[-1] == "&ndash;"  # unscored last


def listed_rows(html: str) -> set[tuple[str, int]]:
    """(task key, rollout index) of each row the list shows."""
    return {
        (key, int(index))
        for key, index in re.findall(
            r"episode\?task=(task-\d+)'>(?:(?!</td>).)*</a></td><td><a class=open "
            r"href='[^']+'>#(\d+)</a>",
            html,
        )
    }


def test_rollout_list_filters_by_turns_and_duration(tmp_path: Path) -> None:
    # Task t's ok rollouts run 0.6 + t seconds; task 3's take a third turn; task 0's rollout 1
    # fails in setup (no turn, 0.2 s).
    traces = [make_trace(t, r) for t in range(4) for r in range(2)]
    for trace in traces:
        if not trace.ok:
            continue
        task = int(trace.task.key.rsplit("-", 1)[1])
        start = trace.timing["agent"].start
        if task == 3:
            trace.record_call(
                trace.messages,
                Message(role="assistant", content="Checked: yes."),
                usage=Usage(input_tokens=40, output_tokens=3),
                started_at=start + 0.5,
                ended_at=start + 0.55,
                finish_reason="stop",
                model="scripted:bash",
            )
        trace.timing["agent"] = PhaseTiming(start=start, end=start + 0.4 + task)
    write_traces(traces_to_table(traces), tmp_path / "run" / "traces")
    every = {(f"task-{t:04d}", r) for t in range(4) for r in range(2)}
    with serve_in_thread(create_app([tmp_path / "run"])) as url, httpx.Client(base_url=url) as c:

        def rows(**params: str) -> set[tuple[str, int]]:
            page = c.get("/run/0/rollouts", params=params).text
            found = listed_rows(page)
            assert f"{len(found)} rollouts match" in page
            return found

        assert rows() == every
        assert rows(max_turns="0") == {("task-0000", 1)}
        assert rows(min_turns="1") == every - {("task-0000", 1)}
        assert rows(min_turns="3") == {("task-0003", 0), ("task-0003", 1)}
        assert rows(min_turns="2", max_turns="2") == every - {
            ("task-0000", 1),
            ("task-0003", 0),
            ("task-0003", 1),
        }
        assert rows(max_duration="0.5") == {("task-0000", 1)}
        middle = {("task-0001", 0), ("task-0001", 1), ("task-0002", 0), ("task-0002", 1)}
        assert rows(min_duration="1", max_duration="3") == middle
        assert rows(min_turns="2", min_duration="2.5") == {
            ("task-0002", 0),
            ("task-0002", 1),
            ("task-0003", 0),
            ("task-0003", 1),
        }
        assert rows(status="error", min_turns="1") == set()
        assert rows(min_turns="many") == every  # not a number: no bound, as for the reward
        page = c.get(
            "/run/0/rollouts", params={"min_turns": "2", "max_duration": "2.5", "sort": "reward"}
        ).text
    # The form shows the bounds as typed, and sorting a column keeps them.
    assert "name=min_turns size=6 placeholder='turns ≥' value='2'" in page
    assert "name=max_duration size=9 placeholder='duration s ≤' value='2.5'" in page
    assert "name=max_turns size=6 placeholder='turns ≤' value=''" in page
    assert re.search(r"sort=num_turns[^']*min_turns=2|min_turns=2[^']*sort=num_turns", page)


def test_rollout_page_renders_branches_tools_reasoning_usage_and_unknown_fields(
    client: httpx.Client,
) -> None:
    listed = client.get("/run/0/rollouts", params={"task": "task-0002", "sort": "rollout_index"})
    page = client.get(rollout_links(listed.text)[0])
    assert page.status_code == 200
    seen = text(page.text)
    # Task 2 compacted its history: two branches, the final one open first.
    assert page.text.count("class=branch") == 2 and "branch 1: 4 messages" in seen
    assert "tool call bash" in seen and '"command": "expr 2 + 2"' in page.text.replace(
        "&quot;", '"'
    )
    assert "reasoning" in seen and "use bash" in seen
    assert "result of call_1" in seen and "The answer is 4." in seen
    assert "call #1 · 30 in / 6 out · stop" in seen
    assert "completed" in seen and "trajectory.json" in seen
    # Fields this viewer does not know are shown, not dropped: a trace field and a message field.
    assert "Other fields" in seen and "red-team" in seen and "judge-mini" in seen
    assert "segment user-sim-1" in seen
    tokens = re.findall(r"data-src='([^']+)'", page.text)
    assert len(tokens) == 1  # only the first call carried token ids
    reply = client.get(tokens[0]).json()
    assert reply == {
        "prompt_token_ids": [101, 102, 103],
        "completion_token_ids": [7, 8],
        "completion_logprobs": [-0.25, -0.5],
    }


def test_errored_rollout_shows_its_error_with_phase_and_detail(client: httpx.Client) -> None:
    listed = client.get("/run/0/rollouts", params={"status": "error"})
    seen = text(client.get(rollout_links(listed.text)[0]).text)
    assert "TaskError setup fixture task-0000 is missing" in seen
    assert "Traceback (most recent call last)" in seen and "no model call was recorded" in seen


def test_episode_page_puts_the_group_side_by_side_with_group_rewards_and_advantages(
    client: httpx.Client,
) -> None:
    page = client.get("/run/0/episode", params={"task": "task-0004"})
    seen = text(page.text)
    assert page.text.count("<div class=lane>") == 2
    assert "group reward brevity_rank [1, 1]" in seen and "advantages [0, &ndash;]" in seen
    assert "fixture task-0004 is missing" in seen and "The answer is 8." in seen
    tasks = client.get("/run/0/episodes")
    assert tasks.text.count("/run/0/episode?task=") == 6
    missing = client.get("/run/0/episode", params={"task": "nope"})
    assert missing.status_code == 200 and "No task nope" in missing.text


def test_retried_rollouts_show_their_last_attempt_unless_every_attempt_is_asked_for(
    tmp_path: Path,
) -> None:
    run = write_run(tmp_path / "run", tasks=2)
    retry = make_trace(0, 0)  # an ok rollout...
    retry.rollout_index, retry.attempt = 1, 1  # ...as the errored rollout 1's retry (resume)
    write_traces(traces_to_table([retry]), run / "traces")
    with serve_in_thread(create_app([run])) as url, httpx.Client(base_url=url) as c:
        assert "errored 0" in text(c.get("/run/0").text)
        assert "4 rollouts match" in c.get("/run/0/rollouts").text
        every = c.get("/run/0/rollouts", params={"attempts": "all", "sort": "attempt"}).text
    assert "5 rollouts match" in every and "1 rollouts match" not in every


def test_two_runs_compared_task_by_task(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a", tasks=4)
    b = write_run(tmp_path / "b", tasks=6)
    with serve_in_thread(create_app([a, b])) as url:
        index = httpx.get(url + "/")
        assert index.status_code == 200 and "compare run 0 with run 1" in index.text
        page = httpx.get(url + "/compare", params={"a": "0", "b": "1"})
    seen = text(page.text)
    assert "tasks in both 4" in seen and "only in A / only in B 0 / 2" in seen
    assert page.text.count("/run/1/episode?task=") == 6


def test_a_run_being_written_is_followed(run_dir: Path, client: httpx.Client) -> None:
    before = client.get("/api/run/0/stamp").json()
    assert before["rows"] == 12
    assert f"seen={before['stamp']}" in client.get("/run/0").text
    write_traces(traces_to_table([make_trace(40, 0), make_trace(41, 0)]), run_dir / "traces")
    after = client.get("/api/run/0/stamp").json()
    assert after["rows"] == 14 and after["stamp"] != before["stamp"]
    assert "14 rollouts match" in client.get("/run/0/rollouts").text


def test_browsing_writes_nothing_into_the_run_folder(run_dir: Path, client: httpx.Client) -> None:
    before = listing(run_dir)
    pages = ["/run/0", "/run/0/rollouts?q=bash&sort=reward", "/run/0/episodes", "/api/run/0/stamp"]
    for path in pages:
        assert client.get(path).status_code == 200
    for link in rollout_links(client.get("/run/0/rollouts").text):
        page = client.get(link)
        for src in re.findall(r"data-src='([^']+)'", page.text):
            client.get(src)
    client.get("/run/0/episode", params={"task": "task-0001"})
    assert listing(run_dir) == before


@pytest.mark.parametrize("case", ["empty", "not-a-run", "half-written", "older", "corrupt"])
def test_bad_folders_get_a_clear_page(tmp_path: Path, case: str) -> None:
    folder = tmp_path / case
    folder.mkdir()
    expect: list[str]
    if case == "empty":
        expect = ["Nothing to show", "is empty"]
    elif case == "not-a-run":
        (folder / "notes.txt").write_text("hello")
        expect = ["is not a vfray run folder", "notes.txt"]
    elif case == "half-written":
        write_traces(traces_to_table([make_trace(1, 0)]), folder / "traces")
        (folder / "traces" / ".tmp-0123.parquet").write_bytes(b"PAR1 half")
        expect = ["No config.json", "rollouts 1"]
    elif case == "older":
        table = traces_to_table([make_trace(1, 0), make_trace(1, 1)])
        table = table.drop_columns(["advantage", "policy_version", "num_branches", "metrics"])
        metadata = {**table.schema.metadata, SCHEMA_VERSION_KEY: b"0"}
        (folder / "traces").mkdir()
        pq.write_table(
            table.replace_schema_metadata(metadata), folder / "traces/part-00000.parquet"
        )
        expect = ["Written by an older vfray (trace schema version 0", "rollouts 2"]
    else:
        write_run(folder, tasks=2)
        good = folder / "traces" / "part-00000.parquet"
        (folder / "traces" / "part-00001.parquet").write_bytes(good.read_bytes()[:300])
        expect = ["part-00001.parquet cannot be read and is left out", "rollouts 4"]
    before = listing(folder)
    with serve_in_thread(create_app([folder])) as url, httpx.Client(base_url=url) as c:
        pages = [c.get(p) for p in ("/run/0", "/run/0/rollouts", "/run/0/episodes")]
        rollouts = rollout_links(pages[1].text)
        if rollouts:
            pages.append(c.get(rollouts[0]))
    for reply in pages:
        assert reply.status_code == 200, reply.text
        assert "Traceback" not in reply.text
    seen = text(pages[0].text)
    for words in expect:
        assert words in seen, seen
    assert listing(folder) == before


def test_an_unknown_rollout_or_run_is_a_not_found_page(client: httpx.Client) -> None:
    for path in ("/run/0/rollout/0123abcd", "/run/7", "/api/run/0/rollout/00/call/0"):
        reply = client.get(path)
        assert reply.status_code == 404 and "Traceback" not in reply.text


def _vfray(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "vfray.cli.main", "view", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_the_command_prints_its_url_and_serves_until_stopped(run_dir: Path) -> None:
    proc = _vfray(str(run_dir), "--port", "0")
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        url = re.search(r"http://127\.0\.0\.1:\d+/", line)
        assert url is not None, line + (proc.stderr.read() if proc.stderr else "")
        page = httpx.get(url.group(0) + "run/0", timeout=30)
        assert page.status_code == 200 and "run-synthetic" in page.text
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_the_command_refuses_a_missing_folder_and_a_busy_port_in_one_line(
    tmp_path: Path, run_dir: Path
) -> None:
    missing = _vfray(str(tmp_path / "nope"))
    _, err = missing.communicate(timeout=60)
    assert (
        missing.returncode == 2 and err.strip() == f"vfray: error: no such folder: {tmp_path}/nope"
    )
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        taken = _vfray(str(run_dir), "--port", str(busy.getsockname()[1]))
        _, err = taken.communicate(timeout=60)
    assert taken.returncode == 2 and len(err.strip().splitlines()) == 1
    assert "cannot listen on 127.0.0.1:" in err and "--port" in err


def test_the_viewer_is_package_data(tmp_path: Path) -> None:
    """A built wheel carries the page assets (so `pip install` serves them).

    Built the way pip builds for a user, in an isolated build env that gets the setuptools
    pyproject.toml asks for: with ``--no-build-isolation`` it used the venv's own, which in a
    fresh ``python3 -m venv`` is Python 3.11's bundled setuptools 65.5, too old to read
    pyproject.toml's ``license = "Apache-2.0"``, so the test failed on every fresh venv."""
    shutil.copytree(
        Path(__file__).parents[1],
        tmp_path / "src",
        ignore=shutil.ignore_patterns(".git", "outputs", "*.egg-info", "build", "__pycache__"),
    )
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
         "-w", str(tmp_path / "dist"), str(tmp_path / "src")],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    import zipfile

    (wheel,) = (tmp_path / "dist").glob("vfray-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "vfray/view/static/view.js" in names and "vfray/view/static/view.css" in names
    assert json.dumps(sorted(n for n in names if n.startswith("vfray/view/")))
