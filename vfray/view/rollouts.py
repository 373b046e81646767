"""The rollout list: filter (status or error type, stop condition, task key, reward, turns and
duration ranges, search in transcripts), sort by any column, and page through; each row links to
its rollout."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from vfray.run.results import final_rows
from vfray.view._html import esc, href, num, table, task_label
from vfray.view.runs import RunFolder, Snapshot

PAGE_SIZE = 100
COLUMNS = (
    ("task_key", "task"),
    ("rollout_index", "rollout"),
    ("attempt", "attempt"),
    ("reward", "reward"),
    ("error_type", "status"),
    ("stop_condition", "stop"),
    ("num_turns", "turns"),
    ("duration_s", "duration s"),
    ("input_tokens", "in tokens"),
    ("output_tokens", "out tokens"),
)


@dataclass(frozen=True)
class Filters:
    """The list's query string, parsed once."""

    status: str = ""
    stop: str = ""
    task: str = ""
    q: str = ""
    min_reward: float | None = None
    max_reward: float | None = None
    min_turns: float | None = None
    max_turns: float | None = None
    min_duration: float | None = None
    max_duration: float | None = None
    sort: str = ""
    desc: bool = False
    all_attempts: bool = False
    page: int = 0

    @classmethod
    def parse(cls, params: Mapping[str, str]) -> Filters:
        def number(name: str) -> float | None:
            try:
                return float(params[name]) if params.get(name) else None
            except ValueError:
                return None

        page = params.get("page", "0")
        return cls(
            status=params.get("status", ""),
            stop=params.get("stop", ""),
            task=params.get("task", ""),
            q=params.get("q", ""),
            min_reward=number("min_reward"),
            max_reward=number("max_reward"),
            min_turns=number("min_turns"),
            max_turns=number("max_turns"),
            min_duration=number("min_duration"),
            max_duration=number("max_duration"),
            sort=params.get("sort", ""),
            desc=params.get("dir") == "desc",
            all_attempts=params.get("attempts") == "all",
            page=int(page) if page.isdigit() else 0,
        )

    def query(self, **changes: object) -> dict[str, object]:
        values: dict[str, object] = {
            "status": self.status,
            "stop": self.stop,
            "task": self.task,
            "q": self.q,
            "min_reward": self.min_reward,
            "max_reward": self.max_reward,
            "min_turns": self.min_turns,
            "max_turns": self.max_turns,
            "min_duration": self.min_duration,
            "max_duration": self.max_duration,
            "sort": self.sort,
            "dir": "desc" if self.desc else "",
            "attempts": "all" if self.all_attempts else "",
        }
        values.update(changes)
        return values


def select(run: RunFolder, snap: Snapshot, f: Filters) -> pa.Table:
    """The rows the filters keep, sorted."""
    rows = snap.rows.append_column("_i", pa.array(range(snap.rows.num_rows), pa.int64()))
    rows = rows if f.all_attempts else final_rows(rows)
    if f.status == "ok":
        rows = rows.filter(pc.equal(rows.column("ok"), True))
    elif f.status == "error":
        rows = rows.filter(pc.equal(rows.column("ok"), False))
    elif f.status:
        rows = rows.filter(pc.equal(rows.column("error_type"), f.status))
    if f.stop:
        rows = rows.filter(pc.equal(rows.column("stop_condition"), f.stop))
    if f.task:
        rows = rows.filter(pc.match_substring(rows.column("task_key"), f.task, ignore_case=True))
    # A range drops the rows without a value (an unscored reward, an untimed rollout): asking
    # for "at least 3 turns" does not mean "or unknown".
    for column, low, high in (
        ("reward", f.min_reward, f.max_reward),
        ("num_turns", f.min_turns, f.max_turns),
        ("duration_s", f.min_duration, f.max_duration),
    ):
        if low is not None:
            rows = rows.filter(pc.greater_equal(rows.column(column), low))
        if high is not None:
            rows = rows.filter(pc.less_equal(rows.column(column), high))
    if f.q:
        hits = run.search(snap, f.q).cast(pa.int64())
        rows = rows.filter(pc.is_in(rows.column("_i"), value_set=hits))
    if f.sort in rows.column_names and not f.sort.startswith("_"):
        order = "descending" if f.desc else "ascending"
        rows = rows.take(pc.sort_indices(rows, [(f.sort, order)]))  # nulls last by default
    return rows


def _options(values: list[str], chosen: str, first: tuple[str, str]) -> str:
    items = [first, *((v, v) for v in values)]
    return "".join(
        f"<option value='{esc(v)}'{' selected' if v == chosen else ''}>{esc(label)}</option>"
        for v, label in items
    )


def _bound(name: str, value: float | None, placeholder: str, size: int = 6) -> str:
    # 2, not 2.0, back in the box a whole number was typed into.
    shown = "" if value is None else str(int(value)) if value.is_integer() else repr(value)
    return f"<input name={name} size={size} placeholder='{esc(placeholder)}' value='{esc(shown)}'>"


def _form(snap: Snapshot, f: Filters) -> str:
    final = snap.rows
    errors = sorted({e for e in final.column("error_type").to_pylist() if e})
    stops = sorted({s for s in final.column("stop_condition").to_pylist() if s})
    status = _options(["ok", "error", *errors], f.status, ("", "any status"))
    return (
        "<form class=filters method=get>"
        f"<select name=status>{status}</select>"
        f"<select name=stop>{_options(stops, f.stop, ('', 'any stop condition'))}</select>"
        f"<input name=task placeholder='task key contains' value='{esc(f.task)}'>"
        f"{_bound('min_reward', f.min_reward, 'reward ≥')}"
        f"{_bound('max_reward', f.max_reward, 'reward ≤')}"
        f"{_bound('min_turns', f.min_turns, 'turns ≥')}"
        f"{_bound('max_turns', f.max_turns, 'turns ≤')}"
        f"{_bound('min_duration', f.min_duration, 'duration s ≥', 9)}"
        f"{_bound('max_duration', f.max_duration, 'duration s ≤', 9)}"
        f"<input name=q placeholder='search transcripts' value='{esc(f.q)}'>"
        f"<input type=hidden name=sort value='{esc(f.sort)}'>"
        f"<input type=hidden name=dir value='{'desc' if f.desc else ''}'>"
        "<label><input type=checkbox name=attempts value=all"
        f"{' checked' if f.all_attempts else ''}> every attempt</label>"
        "<button type=submit id=apply>filter</button></form>"
    )


def list_page(base: str, run: RunFolder, snap: Snapshot, f: Filters) -> str:
    rows = select(run, snap, f)
    total = rows.num_rows
    shown = rows.slice(f.page * PAGE_SIZE, PAGE_SIZE)
    columns = [*COLUMNS, *((c, c) for c in snap.extra_columns)]
    head = []
    for name, label in columns:
        desc = f.sort == name and not f.desc
        arrow = (" ▼" if f.desc else " ▲") if f.sort == name else ""
        link = href(f"{base}/rollouts", **f.query(sort=name, dir="desc" if desc else ""))
        head.append(f"<a class=sort href='{link}'>{esc(label)}{arrow}</a>")
    body = []
    for row in shown.to_pylist():
        link = f"{base}/rollout/{row['trace_id']}"
        status = (
            "<span class=ok>ok</span>"
            if row["ok"]
            else f"<span class=err>{esc(row['error_type'] or 'error')}</span>"
        )
        cells = {
            "task_key": f"<a href='{href(base + '/episode', task=row['task_key'])}'>"
            f"{task_label(row['task_key'], row.get('_prompt'))}</a>",
            "rollout_index": f"<a class=open href='{esc(link)}'>#{row['rollout_index']}</a>",
            "error_type": status,
            "stop_condition": esc(row["stop_condition"]),
        }
        body.append([cells.get(name) or num(row.get(name)) for name, _ in columns])
    pages = ""
    if total > PAGE_SIZE:
        links = []
        here = f"{base}/rollouts"
        if f.page > 0:
            links.append(f"<a href='{href(here, **f.query(page=f.page - 1))}'>&lsaquo; prev</a>")
        if (f.page + 1) * PAGE_SIZE < total:
            links.append(f"<a href='{href(here, **f.query(page=f.page + 1))}'>next &rsaquo;</a>")
        pages = f"<p class=pages>{' '.join(links)}</p>"
    first = f.page * PAGE_SIZE + 1 if total else 0
    last = min(total, (f.page + 1) * PAGE_SIZE)
    return (
        f"<h1>Rollouts</h1>{_form(snap, f)}"
        f"<p class=count id=count>{num(total)} rollouts match; showing {first}&ndash;{last}</p>"
        f"{table(head, body, 'rollouts')}{pages}"
    )
