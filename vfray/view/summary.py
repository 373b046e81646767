"""The run summary page: config, counts, reward mean ± stderr (and, when it differs, the mean
over the rollouts that count for training), pass@k, a reward histogram, the per-reward and
per-metric breakdown, stop conditions, errors by type with their first messages, and time per
phase."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from vfray.run.error_examples import first_errors
from vfray.run.results import summarize
from vfray.traces.schema import PHASES
from vfray.view._html import as_json, esc, histogram, href, kv, note, num, pre, table
from vfray.view.runs import Snapshot


def notes_html(snap: Snapshot) -> str:
    return "".join(note(n, "note warn") for n in snap.notes)


def problem_html(snap: Snapshot) -> str:
    return f"<section class=problem><h2>Nothing to show</h2>{note(snap.problem or '')}</section>"


def _scores(final: pa.Table, column: str) -> dict[str, pa.Array]:
    """name -> its values (nulls where unscored), without a Python object per score."""
    if column not in final.column_names or len(final) == 0:
        return {}
    pairs = pc.list_flatten(final.column(column))
    if len(pairs) == 0:
        return {}
    keys, values = pc.struct_field(pairs, "key"), pc.struct_field(pairs, "value")
    return {
        str(name): values.filter(pc.equal(keys, name))
        for name in pc.unique(keys).to_pylist()
        if name is not None
    }


def _breakdown(base: str, final: pa.Table, column: str) -> str:
    scores = _scores(final, column)
    if not scores:
        return "<p class=dim>none recorded</p>"
    rows = []
    for name, raw in sorted(scores.items()):
        finite = raw.filter(pc.is_finite(raw))
        vals = finite.to_pylist()
        rows.append(
            [
                esc(name),
                num(pc.mean(finite).as_py()),
                num(pc.min(finite).as_py()),
                num(pc.max(finite).as_py()),
                num(len(vals)),
                num(len(raw) - len(vals)),
                histogram(vals, bins=10, width=160, height=40),
            ]
        )
    head = ["name", "mean", "min", "max", "scored", "unscored", "distribution"]
    return table(head, rows, "scores")


def _phases(final: pa.Table) -> str:
    rows = []
    for phase in PHASES:
        col = f"{phase}_s"
        if col not in final.column_names:
            continue
        values = final.column(col).drop_null()
        if len(values) == 0:
            continue
        q = pc.quantile(values, q=[0.5, 0.9]).to_pylist()
        rows.append(
            [
                esc(phase),
                num(pc.mean(values).as_py()),
                num(q[0]),
                num(q[1]),
                num(pc.max(values).as_py()),
            ]
        )
    if not rows:
        return "<p class=dim>no phase timings</p>"
    return table(["phase", "mean s", "p50 s", "p90 s", "max s"], rows)


def summary_page(base: str, snap: Snapshot) -> str:
    """Built once per snapshot: it reads every row, and the run has not changed since."""
    key = f"summary:{base}"
    if key not in snap.pages:
        snap.pages[key] = _summary(base, snap)
    return snap.pages[key]


def _summary(base: str, snap: Snapshot) -> str:
    final = snap.final
    summary: dict[str, Any] = summarize(snap.rows, snap.episodes)
    rollouts = f"{base}/rollouts"
    mean, stderr = summary["reward_mean"], summary["reward_stderr"]
    counted = summary["reward_mean_counted"]
    # Rollouts that failed for infrastructure reasons carry no policy signal: group means and
    # advantages leave them out, and so does this mean (shown only when that changes it).
    left_out = (
        [
            (
                "reward mean ± stderr, infra failures left out",
                _plus_minus(counted, summary["reward_stderr_counted"]),
            )
        ]
        if counted is not None and counted != mean
        else []
    )
    errored = summary["rollouts"] - summary["ok"]
    counts = [
        ("rollouts", f"<a href='{href(rollouts)}'>{num(summary['rollouts'])}</a>"),
        ("attempts (with retries)", num(summary["attempts"])),
        ("ok", num(summary["ok"])),
        ("errored", f"<a href='{href(rollouts, status='error')}'>{num(errored)}</a>"),
        ("reward mean ± stderr", _plus_minus(mean, stderr)),
        *left_out,
        *((k, num(v)) for k, v in summary.items() if k.startswith("pass@")),
        ("tasks", f"<a href='{href(base + '/episodes')}'>{num(len(set(_keys(final))))}</a>"),
        (
            "input / output tokens",
            f"{num(summary['input_tokens'])} / {num(summary['output_tokens'])}",
        ),
    ]
    config = snap.config or {}
    settings = config.get("config") or {}
    about = [
        ("folder", esc(snap.path)),
        ("taskset", esc(config.get("taskset"))),
        ("model", esc((settings.get("model") or {}).get("name"))),
        ("harness", esc(((settings.get("env") or {}).get("harness") or {}).get("id"))),
        ("runtime", esc(((settings.get("env") or {}).get("runtime") or {}).get("type"))),
        ("rollouts per task", esc(config.get("rollouts_per_task"))),
        ("created", esc(config.get("created"))),
        ("versions", esc(", ".join(f"{k} {v}" for k, v in (config.get("versions") or {}).items()))),
    ]
    stops = [
        [f"<a href='{href(rollouts, stop=s)}'>{esc(s)}</a>", num(n)]
        for s, n in sorted(summary["stop_conditions"].items(), key=lambda kv: -kv[1])
    ]
    errors = [
        [
            f"<a href='{href(rollouts, status=e.type)}'>{esc(e.type)}</a>",
            num(e.count),
            esc(e.phase),
            esc(e.message),
            f"<a href='{href(base + '/rollouts', task=e.task_key)}'>{esc(e.task_key)}</a>"
            f" #{e.rollout_index}",
        ]
        for e in first_errors(final)
    ]
    rewards = [r for r in final.column("reward").to_pylist() if r is not None] if len(final) else []
    body = [
        f"<h1>{esc(snap.title)}</h1>",
        notes_html(snap),
        "<div class=cards>",
        f"<section><h2>Counts</h2>{kv(counts)}</section>",
        f"<section><h2>Run</h2>{kv(about)}</section>",
        "</div>",
        f"<section><h2>Reward</h2>{histogram(rewards)}</section>",
        f"<section><h2>Rewards</h2>{_breakdown(base, final, 'rewards')}</section>",
        f"<section><h2>Metrics</h2>{_breakdown(base, final, 'metrics')}</section>",
        "<div class=cards>",
        "<section><h2>Stop conditions</h2>"
        + (table(["stop condition", "rollouts"], stops) if stops else "<p class=dim>none</p>")
        + "</section>",
        f"<section><h2>Time per phase</h2>{_phases(final)}</section>",
        "</div>",
        "<section id=errors><h2>Errors by type, phase and message (the first of each)</h2>"
        + (
            table(["type", "rollouts", "phase", "first message", "first rollout"], errors)
            if errors
            else "<p class=dim>no errors</p>"
        )
        + "</section>",
        "<section><details><summary>Resolved config (config.json)</summary>"
        + pre(as_json(config))
        + "</details></section>",
    ]
    return "".join(body)


def _plus_minus(mean: float | None, stderr: float | None) -> str:
    return num(mean) + (f" ± {num(stderr)}" if stderr is not None else "")


def _keys(final: pa.Table) -> list[str]:
    return [str(k) for k in final.column("task_key").to_pylist()] if len(final) else []
