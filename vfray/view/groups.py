"""Pages about task groups: the list of tasks, one episode (the group's rollouts side by side
with their group rewards and advantages), and two runs compared task by task."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from vfray.view._html import esc, href, kv, num, table, task_label, value
from vfray.view.rollout import conversation
from vfray.view.runs import RunFolder, Snapshot


def _by_task(final: pa.Table) -> dict[str, dict[str, Any]]:
    """Per task key (in run order): rollouts, rewards, ok count."""
    out: dict[str, dict[str, Any]] = {}
    columns = final.select(["task_key", "reward", "ok"]).to_pydict() if len(final) else {}
    for key, reward, ok in zip(
        columns.get("task_key", []), columns.get("reward", []), columns.get("ok", []), strict=True
    ):
        group = out.setdefault(key, {"n": 0, "rewards": [], "ok": 0})
        group["n"] += 1
        group["ok"] += 1 if ok else 0
        if reward is not None:
            group["rewards"].append(reward)
    return out


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def tasks_page(base: str, snap: Snapshot) -> str:
    episodes = {r["task_key"]: r for r in snap.episodes.to_pylist()}
    prompts = snap.prompts()
    rows = []
    for key, group in _by_task(snap.final).items():
        episode = episodes.get(key) or {}
        rows.append(
            [
                f"<a href='{href(base + '/episode', task=key)}'>"
                f"{task_label(key, prompts.get(key))}</a>",
                num(group["n"]),
                num(_mean(group["rewards"])),
                num(group["n"] - group["ok"]),
                num(episode.get("pass_at_1")),
                num(episode.get("pass_at_n")),
            ]
        )
    head = ["task", "rollouts", "mean reward", "errored", "pass@1", "pass@n"]
    return f"<h1>Tasks</h1>{table(head, rows, 'tasks')}"


def episode_page(base: str, run: RunFolder, snap: Snapshot, key: str) -> str:
    final = snap.final
    rows = final.filter(pc.equal(final.column("task_key"), key)).to_pylist() if len(final) else []
    if not rows:
        return f"<h1>No task {esc(key)}</h1><p>This run has no rollout of that task.</p>"
    rows.sort(key=lambda r: r["rollout_index"])
    matches = [e for e in snap.episodes.to_pylist() if e["task_key"] == key]
    episode: dict[str, Any] = matches[-1] if matches else {}
    columns = []
    for row in rows:
        trace = run.trace_json(snap, row["_part"], row["_row"])
        link = f"{base}/rollout/{row['trace_id']}"
        status = "ok" if row["ok"] else f"<span class=err>{esc(row['error_type'])}</span>"
        errors = "".join(
            f"<p class=err>{esc(e.get('type'))} ({esc(e.get('phase'))}): "
            f"{esc(e.get('message'))}</p>"
            for e in trace.get("errors") or []
            if isinstance(e, dict)
        )
        columns.append(
            f"<div class=lane><h3><a href='{esc(link)}'>rollout #{row['rollout_index']}</a></h3>"
            + kv(
                [
                    ("reward", num(row["reward"])),
                    ("advantage", num(row["advantage"])),
                    ("status", status),
                    ("stop", esc(row["stop_condition"])),
                    ("turns", num(row["num_turns"])),
                ]
            )
            + errors
            + conversation(trace, compact=True)
            + "</div>"
        )
    group = [
        ("rollouts", num(len(rows))),
        ("mean reward", num(episode.get("mean_reward"))),
        ("pass@1", num(episode.get("pass_at_1"))),
        ("pass@n", num(episode.get("pass_at_n"))),
        ("rewards", value(episode.get("rewards"))),
        ("advantages", value(episode.get("advantages"))),
        *(
            (f"group reward {g['key']}", value(g["values"]))
            for g in episode.get("group_rewards") or []
        ),
    ]
    if not episode:
        group.append(("episode row", "<span class=dim>none written (yet)</span>"))
    return (
        f"<h1>Episode of {task_label(key, snap.prompts().get(key))}</h1>"
        f"<section>{kv(group)}</section>"
        f"<div class=lanes style='--lanes:{len(columns)}'>{''.join(columns)}</div>"
    )


def compare_page(names: list[str], snaps: list[Snapshot], a: int, b: int) -> str:
    left, right = _by_task(snaps[a].final), _by_task(snaps[b].final)
    shared = [k for k in left if k in right]
    rows, wins, losses = [], 0, 0
    deltas: list[tuple[float, list[str]]] = []
    for key in [
        *shared,
        *(k for k in left if k not in right),
        *(k for k in right if k not in left),
    ]:
        ma = _mean(left[key]["rewards"]) if key in left else None
        mb = _mean(right[key]["rewards"]) if key in right else None
        delta = None if ma is None or mb is None else mb - ma
        if delta is not None:
            wins += delta > 0
            losses += delta < 0
        cell_a = (
            f"<a href='{href(f'/run/{a}/episode', task=key)}'>{num(ma)}</a>"
            if key in left
            else "&ndash;"
        )
        cell_b = (
            f"<a href='{href(f'/run/{b}/episode', task=key)}'>{num(mb)}</a>"
            if key in right
            else "&ndash;"
        )
        cls = "" if delta is None or delta == 0 else ("up" if delta > 0 else "down")
        row = [esc(key), cell_a, cell_b, f"<span class='{cls}'>{num(delta)}</span>"]
        deltas.append((-(abs(delta) if delta is not None else -1.0), row))
    deltas.sort(key=lambda d: d[0])
    rows = [r for _, r in deltas]
    shared_a = _mean([x for k in shared for x in left[k]["rewards"]])
    shared_b = _mean([x for k in shared for x in right[k]["rewards"]])
    facts = [
        ("A", esc(names[a])),
        ("B", esc(names[b])),
        ("tasks in both", num(len(shared))),
        (
            "only in A / only in B",
            f"{num(len(left) - len(shared))} / {num(len(right) - len(shared))}",
        ),
        ("mean reward on shared tasks (A → B)", f"{num(shared_a)} → {num(shared_b)}"),
        ("tasks B does better / worse", f"{num(wins)} / {num(losses)}"),
    ]
    head = ["task", "A mean reward", "B mean reward", "B &minus; A"]
    return f"<h1>Compare runs</h1>{kv(facts)}{table(head, rows, 'compare')}"
