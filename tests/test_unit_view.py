"""vfray.view's parts without a server: the HTML blocks (numbers, escaping, any JSON value, the
histogram), messages and branches rendered from odd trace data, and ``RunFolder`` reading
run folders that are missing, foreign, half-written, corrupt, older or newer than this vfray,
re-read only when their listing changes. tests/test_view.py serves whole pages over HTTP."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.view_runs import make_trace, write_run
from vfray.traces.io import traces_to_table
from vfray.traces.schema import SCHEMA_VERSION_KEY, TRACE_SCHEMA_VERSION
from vfray.view import _html
from vfray.view.rollout import conversation, message_html, tokens
from vfray.view.runs import RunFolder

# --- HTML blocks --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (None, "&ndash;"),
        (True, "yes"),
        (False, "no"),
        (0, "0"),
        (1234567, "1,234,567"),
        (0.5, "0.5"),
        (2 / 3, "0.667"),
        (123456.7, "123,457"),
        (float("nan"), "NaN"),
        (float("inf"), "∞"),
        (float("-inf"), "&minus;∞"),
        ("<b>", "&lt;b&gt;"),
    ],
)
def test_numbers_are_shown_for_reading(value: object, shown: str) -> None:
    assert _html.num(value) == shown


def test_links_drop_empty_parameters_and_escape() -> None:
    assert _html.href("/run/0/rollouts") == "/run/0/rollouts"
    assert _html.href("/r", q="a b", sort="", page=None, n=0) == "/r?q=a+b&amp;n=0"
    assert _html.esc(None) == "" and _html.esc("'\"") == "&#x27;&quot;"


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        ({}, "<span class=dim>{}</span>"),
        ([], "<span class=dim>[]</span>"),
        ([1, 2.5, None, "x<y"], "[1, 2.5, &ndash;, x&lt;y]"),
        ("one line", "one line"),
        ("two\nlines", "<pre class=''>two\nlines</pre>"),
        ("<script>alert(1)</script>", "&lt;script&gt;alert(1)&lt;/script&gt;"),
        ({"k": {"n": 1}}, "<tr><th>k</th><td><table class='kv'><tr><th>n</th><td>1</td>"),
        ([{"a": 1}, {"a": 2}], "<div class=item>"),
        (3.0, "3"),
    ],
)
def test_any_json_value_renders(data: Any, fragment: str) -> None:
    assert fragment in _html.value(data)


def test_long_lists_are_cut_and_deep_nesting_is_shown_as_json() -> None:
    shown = _html.value(list(range(500)))
    assert shown.endswith("199, …]") and "200" not in shown.split(", ")[-2:]
    deep: Any = {"leaf": "x"}
    for _ in range(10):
        deep = {"d": deep}
    rendered = _html.value(deep)
    assert rendered.count("<table") == _html.MAX_DEPTH
    assert "&quot;leaf&quot;: &quot;x&quot;" in rendered  # the rest as JSON text
    assert "x" * 201 in _html.value("x" * 201) and _html.value("x" * 201).startswith("<pre")


def test_the_histogram_counts_finite_values_only() -> None:
    assert _html.histogram([]) == "<p class=dim>no values</p>"
    assert _html.histogram([float("nan"), float("inf")]) == "<p class=dim>no values</p>"
    svg = _html.histogram([1.0, 1.0, 1.0], bins=4)  # one value: a bin, not a division by zero
    assert svg.count("<rect") == 4 and "max 3" in svg
    counts = [int(t.rsplit(": ", 1)[1]) for t in _titles(_html.histogram([0, 1, 2, 3, 10], bins=5))]
    assert sum(counts) == 5 and counts[-1] == 1


def _titles(svg: str) -> list[str]:
    return [part.split("</title>")[0] for part in svg.split("<title>")[1:]]


def test_the_page_frame_escapes_its_title_and_crumbs() -> None:
    page = _html.page("a<b", "<p>body</p>", crumbs=[("/x?a=1&b=2", "run <1>")], live="/api/live")
    assert "<title>a&lt;b · vfray view</title>" in page
    assert '<a href="/x?a=1&amp;b=2">run &lt;1&gt;</a>' in page
    assert 'data-live="/api/live"' in page and "<main><p>body</p></main>" in page


# --- messages and branches from odd data --------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "fragments"),
    [
        ({"role": "user", "content": "<i>hi</i>"}, ["role-user", "&lt;i&gt;hi&lt;/i&gt;"]),
        ({}, ["role-?"]),
        (
            {"role": "user", "content": [{"type": "text", "text": "part"}, "bare", {"image": 1}]},
            ["part</pre>", "bare</pre>", "<div class=part>"],
        ),
        (
            {"role": "tool", "tool_call_id": "c1", "name": "bash", "content": "out"},
            ["result of c1", "<span class=dim>bash</span>"],
        ),
        (
            {"role": "assistant", "reasoning_content": "think", "content": None},
            ["<details class=reasoning><summary>reasoning</summary>"],
        ),
        (
            {"role": "assistant", "segment": "user-sim-1", "lane": {"a": 1}},
            ["<div class=extra>", "segment", "user-sim-1"],
        ),
        ({"role": "assistant", "content": {"odd": "shape"}}, ["<th>odd</th>"]),
    ],
)
def test_messages_render_whatever_they_hold(message: dict[str, Any], fragments: list[str]) -> None:
    html = message_html(message)
    for fragment in fragments:
        assert fragment in html, html


@pytest.mark.parametrize(
    ("call", "fragments"),
    [
        (
            {"id": "c1", "function": {"name": "sh", "arguments": '{"cmd": "ls"}'}},
            ["<b>sh</b>", "c1", "&quot;cmd&quot;: &quot;ls&quot;"],
        ),
        # Arguments that are not JSON are shown as the model wrote them.
        ({"id": "c2", "function": {"name": "sh", "arguments": "{not json"}}, ["{not json"]),
        ({"id": "c3", "function": {"name": "sh", "arguments": {"k": 1}}}, ["&quot;k&quot;: 1"]),
        ({"id": "c4", "kind": "custom"}, ["<div class=toolcall><table", "custom"]),
        ("just text", ["<div class=toolcall>just text</div>"]),
    ],
)
def test_tool_calls_render_in_every_shape(call: Any, fragments: list[str]) -> None:
    html = message_html({"role": "assistant", "tool_calls": [call]})
    for fragment in fragments:
        assert fragment in html, html


def test_a_messages_call_shows_its_usage_and_finish_reason() -> None:
    call = {
        "index": 2,
        "usage": {"input_tokens": 1200, "output_tokens": None},
        "finish_reason": "length",
    }
    html = message_html({"role": "assistant", "content": "x"}, call)
    assert "call #2 · 1,200 in / &ndash; out · length" in html
    assert "call #3 · &ndash; in / &ndash; out · " in message_html({}, {"index": 3})


def test_branches_render_final_first_and_missing_messages_are_named() -> None:
    trace = {
        "graph": {
            "m1": {"role": "user", "content": "first"},
            "m2": {"role": "user", "content": "second"},
        },
        "branch_list": [
            {"id": 0, "message_ids": ["m1", "gone"], "call_indices": [0]},
            {"id": 1, "message_ids": ["m2"], "call_indices": [1]},
        ],
        "calls": [{"index": 0, "branch": 0}, {"index": 1, "branch": 1, "response_id": "m2"}],
    }
    html = conversation(trace)
    assert html.index("second") < html.index("first")  # the last call's branch first
    assert "<details class=branch open><summary>branch 1: 1 messages, calls 1" in html
    assert "(missing gone)" in html
    assert "call #1" in html  # m2 is call 1's response
    compact = conversation(trace, compact=True)
    assert compact.startswith("<div class=conv>") and "first" not in compact
    assert conversation({}) == "<p class=dim>no model call was recorded</p>"


def test_a_calls_tokens_are_found_by_its_index() -> None:
    trace = {"calls": [{"index": 0, "prompt_token_ids": [1, 2], "completion_logprobs": [-0.1]}]}
    assert tokens(trace, 0) == {
        "prompt_token_ids": [1, 2],
        "completion_token_ids": None,
        "completion_logprobs": [-0.1],
    }
    assert tokens(trace, 5) == {} and tokens({}, 0) == {}


# --- run folders as the viewer reads them -------------------------------------------------------


def _part(folder: Path, tasks: range, rollouts: int = 1, name: str = "part-00000") -> Path:
    table = traces_to_table([make_trace(t, r) for t in tasks for r in range(rollouts)])
    (folder / "traces").mkdir(parents=True, exist_ok=True)
    path = folder / "traces" / f"{name}.parquet"
    pq.write_table(table, path)
    return path


def _with_version(
    path: Path, version: bytes | None, extra: dict[str, pa.Array] | None = None
) -> None:
    table = pq.read_table(path)
    for name, column in (extra or {}).items():
        table = table.append_column(name, column)
    metadata = dict(table.schema.metadata or {})
    metadata.pop(SCHEMA_VERSION_KEY, None)
    if version is not None:
        metadata[SCHEMA_VERSION_KEY] = version
    pq.write_table(table.replace_schema_metadata(metadata), path)


def test_a_missing_path_or_a_file_is_a_problem_not_an_error(tmp_path: Path) -> None:
    snap = RunFolder(tmp_path / "nowhere").snapshot()
    assert snap.problem == f"{tmp_path / 'nowhere'} does not exist (or is not a folder)."
    (tmp_path / "file").write_text("x")
    assert "is not a folder" in (RunFolder(tmp_path / "file").snapshot().problem or "")
    assert snap.rows.num_rows == 0 and snap.final.num_rows == 0


def test_a_foreign_folder_lists_what_it_holds_up_to_eight_names(tmp_path: Path) -> None:
    for i in range(10):
        (tmp_path / f"f{i}.txt").write_text("")
    (tmp_path / ".hidden").write_text("")
    problem = RunFolder(tmp_path).snapshot().problem or ""
    assert problem.startswith(f"{tmp_path} is not a vfray run folder")
    assert "f0.txt, f1.txt" in problem and "f7.txt, …)" in problem and "f8" not in problem
    assert ".hidden" not in problem


def test_a_broken_config_still_shows_the_traces(tmp_path: Path) -> None:
    _part(tmp_path, range(2))
    (tmp_path / "config.json").write_text("{not json")
    snap = RunFolder(tmp_path).snapshot()
    assert snap.problem is None and snap.config is None and snap.rows.num_rows == 2
    assert snap.notes[0].startswith("config.json cannot be read (")
    assert snap.title == tmp_path.name  # no run id without a config


def test_a_run_that_has_only_started_says_so(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"run_id": "run-7"}))
    snap = RunFolder(tmp_path).snapshot()
    assert snap.title == "run-7" and snap.rows.num_rows == 0
    assert snap.notes == ["No traces/ folder yet: no rollout has finished."]


def test_parts_without_a_version_or_from_another_vfray_get_notes(tmp_path: Path) -> None:
    older = _part(tmp_path, range(1), name="part-00000")
    newer = _part(tmp_path, range(1, 2), name="part-00001")
    bare = _part(tmp_path, range(2, 3), name="part-00002")
    _with_version(older, b"0")
    n = pq.ParquetFile(newer).metadata.num_rows
    _with_version(
        newer,
        str(TRACE_SCHEMA_VERSION + 1).encode(),
        {"lane": pa.array(["red"] * n), "blob": pa.array([b"x"] * n, pa.binary())},
    )
    _with_version(bare, None)
    snap = RunFolder(tmp_path).snapshot()
    notes = " | ".join(snap.notes)
    assert "No config.json" in notes
    assert (
        f"older vfray (trace schema version 0; this one reads version {TRACE_SCHEMA_VERSION})"
        in notes
    )
    assert f"newer vfray (trace schema version {TRACE_SCHEMA_VERSION + 1};" in notes
    assert "Some trace parts carry no schema version" in notes
    assert snap.rows.num_rows == 3
    # A newer writer's scalar column is shown; a binary one is not read at all.
    assert snap.extra_columns == ["lane"]
    assert snap.rows.column("lane").to_pylist() == [None, "red", None]
    assert snap.rows.column("_part").to_pylist() == [0, 1, 2]


def test_a_corrupt_part_is_left_out_with_a_note(tmp_path: Path) -> None:
    good = _part(tmp_path, range(2))
    (tmp_path / "traces" / "part-00001.parquet").write_bytes(good.read_bytes()[:100])
    (tmp_path / "traces" / "part-00002.parquet").write_bytes(b"")
    snap = RunFolder(tmp_path).snapshot()
    left_out = [n for n in snap.notes if "cannot be read and is left out" in n]
    assert [n.split()[0] for n in left_out] == ["part-00001.parquet", "part-00002.parquet"]
    assert snap.rows.num_rows == 2 and snap.parts == [good]


def test_an_unreadable_episodes_table_is_a_note(tmp_path: Path) -> None:
    write_run(tmp_path, tasks=2)
    for part in (tmp_path / "episodes").glob("*.parquet"):
        part.write_bytes(b"PAR1 not really")
    snap = RunFolder(tmp_path).snapshot()
    assert snap.episodes.num_rows == 0
    assert any(n.startswith("The episodes table cannot be read") for n in snap.notes)
    assert snap.rows.num_rows == 4  # the traces are shown regardless


def test_a_snapshot_is_reused_until_the_folder_changes(tmp_path: Path) -> None:
    write_run(tmp_path, tasks=2)
    folder = RunFolder(tmp_path)
    first = folder.snapshot()
    assert folder.snapshot() is first
    _part(tmp_path, range(10, 12), name="part-00009")
    second = folder.snapshot()
    assert second is not first and second.rows.num_rows == first.rows.num_rows + 2
    # A compaction replaces parts: the replaced ones are forgotten, the rows stay right.
    for part in (tmp_path / "traces").glob("part-0000[0-8].parquet"):
        part.unlink()
    third = folder.snapshot()
    assert third.rows.num_rows == 2 and len(folder._parts) == 1


def test_one_rows_trace_and_columns_are_read_from_its_own_part(tmp_path: Path) -> None:
    write_run(tmp_path, tasks=3)
    folder = RunFolder(tmp_path)
    snap = folder.snapshot()
    part, row = 0, snap.rows.num_rows - 1
    trace = folder.trace_json(snap, part, row)
    values = folder.row_values(snap, part, row)
    assert trace["trace_id"] == values["trace_id"] == snap.rows.column("trace_id")[row].as_py()
    assert "trace_json" not in values and "messages" not in values
    with pytest.raises(IndexError, match=f"row {row + 1} is past the end of"):
        folder.trace_json(snap, part, row + 1)
    assert folder.row_values(snap, part, row + 1) == {}


def test_a_part_without_transcripts_has_no_trace_and_no_search_hits(tmp_path: Path) -> None:
    path = _part(tmp_path, range(2))
    table = pq.read_table(path).drop_columns(["trace_json", "messages"])
    pq.write_table(table, path)
    folder = RunFolder(tmp_path)
    snap = folder.snapshot()
    assert folder.trace_json(snap, 0, 0) == {}
    assert folder.search(snap, "answer").to_pylist() == []


def test_search_finds_text_in_any_part_case_insensitively(tmp_path: Path) -> None:
    _part(tmp_path, range(0, 2), name="part-00000")
    _part(tmp_path, range(2, 4), name="part-00001")
    folder = RunFolder(tmp_path)
    snap = folder.snapshot()
    hits = folder.search(snap, "WHAT IS 3 + 3").to_pylist()
    assert [snap.rows.column("task_key")[i].as_py() for i in hits] == ["task-0003"]
    # Reasoning and tool call arguments are searched too.
    assert folder.search(snap, "use BASH").to_pylist() == [0, 1, 2, 3]
    assert len(folder.search(snap, "expr 2 + 2").to_pylist()) == 1
    assert folder.search(RunFolder(tmp_path / "none").snapshot(), "x").to_pylist() == []
