"""vfray traces in verifiers v1's on-disk format (``traces.jsonl``: one Episode per line, traces
with their message-node graph, calls, rewards and metrics), so v1 tooling reads vfray runs; and
a v1 ``traces.jsonl`` (verifiers' own or an export) read back rollout by rollout, with what it
scored and said (:class:`Outcome`), to compare one run on each framework task by task.

Internal: importable, but not the public API (:mod:`vfray`, :mod:`vfray.testing`,
:mod:`vfray.train`, :mod:`vfray.compat.v1`); names here may move."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vfray.compat.v1._adapt import ENV_FINALIZE
from vfray.compat.v1._trace import v1_stop_condition
from vfray.episode import seat_role
from vfray.trace import Message, Trace

_V1_MESSAGE_FIELDS = ("role", "content", "reasoning_content", "tool_call_id", "name")


def _message(message: Message) -> dict[str, Any]:
    out = {k: getattr(message, k) for k in _V1_MESSAGE_FIELDS if getattr(message, k) is not None}
    if message.tool_calls:
        out["tool_calls"] = [
            {
                "id": call.get("id", ""),
                "name": (call.get("function") or {}).get("name", call.get("name", "")),
                "arguments": (call.get("function") or {}).get(
                    "arguments", call.get("arguments", "")
                ),
            }
            for call in message.tool_calls
        ]
    return out


def _nodes(trace: Trace) -> tuple[list[dict[str, Any]], dict[tuple[int, str], int]]:
    """v1's node list: every distinct (parent, message) once, in first-seen order."""
    sampled = {c.response_id for c in trace.calls if c.response_id is not None}
    nodes: list[dict[str, Any]] = []
    index: dict[tuple[int, str], int] = {}
    for branch in trace.branch_list:
        parent = -1
        for mid in branch.message_ids:
            key = (parent, mid)
            if key not in index:
                node: dict[str, Any] = {
                    "message": _message(trace.graph[mid]),
                    "sampled": mid in sampled,
                }
                if parent >= 0:
                    node["parent"] = parent
                index[key] = len(nodes)
                nodes.append(node)
            parent = index[key]
    return nodes, index


def _call_node(
    trace: Trace, index: dict[tuple[int, str], int], call_branch: int, mid: str
) -> int | None:
    for branch in trace.branch_list:
        if branch.id != call_branch or mid not in branch.message_ids:
            continue
        parent = -1
        for m in branch.message_ids:
            parent = index[(parent, m)]
            if m == mid:
                return parent
    return None


def _v1_task(trace: Trace) -> dict[str, Any]:
    data = trace.task.data
    if "v1_data" in data:  # a v1 taskset run through vfray: its own row and type
        kind = str(data["v1_type"]).rsplit(":", 1)[-1]
        return {
            "type": kind,
            "data": data["v1_data"],
            "key": trace.task.key,
            "hash": trace.task.key,
        }
    return {
        "type": trace.task.type.rsplit(":", 1)[-1],
        "data": data,
        "key": trace.task.key,
        "hash": trace.task.hash,
    }


def to_v1_trace(trace: Trace) -> dict[str, Any]:
    """One vfray trace as a v1 ``Trace`` record."""
    nodes, index = _nodes(trace)
    calls = []
    for call in trace.calls:
        node = (
            None
            if call.response_id is None
            else _call_node(trace, index, call.branch, call.response_id)
        )
        record: dict[str, Any] = {
            "node": node,
            "model": call.model,
            "finish_reason": call.finish_reason
            if call.finish_reason in ("stop", "length", "tool_calls")
            else None,
            "usage": {
                "prompt_tokens": call.usage.input_tokens,
                "completion_tokens": call.usage.output_tokens,
            },
            "time": {"start": call.started_at, "end": call.ended_at},
        }
        if call.error is not None:
            record["error"] = {"type": call.error.type, "message": call.error.message}
        calls.append(record)
    rewards = {
        k: None if r.value is None else {"score": r.value, "weight": r.weight}
        for k, r in trace.rewards.items()
        if k != ENV_FINALIZE
    }
    timing: dict[str, Any] = {"start": trace.created_at}
    for phase in ("boot", "setup", "agent", "finalize", "scoring"):
        span = trace.timing.get(phase)
        if span is not None:
            timing[phase] = {"start": span.start, "end": span.end or span.start}
    return {
        "version": 1,
        "id": trace.trace_id,
        "verifiers": {"version": "vfray"},
        "task": _v1_task(trace),
        "agent": {
            "config": {
                "model": trace.agent.model,
                "harness": {"id": trace.agent.harness},
                "runtime": {"type": trace.agent.runtime},
            },
            "name": seat_role(trace.seat) or "agent",
            "trainable": trace.agent.trainable,
        },
        "nodes": nodes,
        "calls": calls,
        "rewards": rewards,
        "metrics": dict(trace.metrics),
        "info": {},
        "is_completed": trace.stop_condition is not None,
        "ok": trace.ok,
        "stop_condition": v1_stop_condition(trace),
        "errors": [{"type": e.type, "message": e.message} for e in trace.errors],
        "timing": timing,
    }


def to_v1_episodes(traces: Iterable[Trace], env_id: str = "") -> Iterator[dict[str, Any]]:
    """v1 Episode records: one per rollout, except that rollouts judged together by a v1 env's
    ``finalize`` (best-of-n) and the seats of one game (an env's own ``run``) share one
    episode, as in v1."""
    grouped: dict[str, list[Trace]] = {}
    for trace in traces:
        joint = ENV_FINALIZE in trace.rewards or trace.seat is not None
        together = joint and trace.episode_id is not None
        grouped.setdefault(trace.episode_id if together else trace.trace_id, []).append(trace)  # type: ignore[arg-type]
    for key, members in grouped.items():
        records = [to_v1_trace(t) for t in sorted(members, key=lambda t: t.rollout_index)]
        yield {
            "id": key,
            "env": {"id": env_id},
            "task": records[0]["task"],
            "ok": all(r["ok"] for r in records),
            "errors": [],
            "traces": records,
        }


def export_run(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write a vfray run folder's final traces as v1's ``traces.jsonl``; returns its path."""
    from vfray.run.results import final_rows
    from vfray.traces.convert import table_to_traces
    from vfray.traces.io import read_traces

    run = Path(run_dir)
    traces = table_to_traces(final_rows(read_traces(run / "traces")))
    header = json.loads((run / "config.json").read_text()) if (run / "config.json").exists() else {}
    # The run's own taskset name (a taskset instance run from Python leaves the config's default).
    config = header.get("config") or {}
    named = str(header.get("taskset") or config.get("taskset", "")).removeprefix("v1:")
    # v1's env id: the taskset's, prefixed by a paired env's (`best-of-n+gsm8k`, EnvConfig.env_id).
    paired = ((config.get("taskset_args") or {}).get("env") or {}).get("id")
    env_id = f"{paired}+{named}" if paired and named else named
    path = Path(out) if out is not None else run / "v1" / "traces.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for episode in to_v1_episodes(traces, env_id):
            fh.write(json.dumps(episode, default=str) + "\n")
    return path


@dataclass(frozen=True)
class Outcome:
    """One rollout of a v1 ``traces.jsonl``, in terms both frameworks record: its task, who
    played it, its scores, how it stopped, and its transcript (messages without ids)."""

    key: str
    rewards: dict[str, float | None]
    metrics: dict[str, float | None]
    reward: float
    stop_condition: str | None
    reply: str
    agent: str = "agent"
    idx: int | None = None
    """The task row's ``idx`` (the key names the row's content; a seat may play a row of its
    own, e.g. user-sim's assistant the row with its prompt nulled)."""
    messages: tuple[dict[str, Any], ...] = ()
    """The transcript: the path to the trace's last message, each message as
    :func:`plain_message` gives it."""
    completion: tuple[dict[str, Any], ...] = ()
    """The messages from the first one the model sampled on (what the rollout added)."""
    errors: tuple[str, ...] = ()
    """The trace's errors, as ``Type: message``."""


def plain_message(message: dict[str, Any]) -> dict[str, Any]:
    """A v1 message without what differs run to run (call ids): role, content (text; parts
    joined), its images' URLs (when it has any), tool calls as (name, parsed arguments), a tool
    result's content."""
    content = message.get("content")
    images: list[str] = []
    if isinstance(content, list):
        parts = [p for p in content if isinstance(p, dict)]
        images = [_image_url(p) for p in parts if p.get("type") == "image_url"]
        content = "".join(str(p.get("text", "")) for p in parts)
    out: dict[str, Any] = {"role": message.get("role"), "content": str(content or "").strip()}
    if images:
        out["images"] = images
    calls = []
    for call in message.get("tool_calls") or []:
        raw = call.get("arguments", "")
        try:
            arguments = json.loads(raw) if isinstance(raw, str) else raw
        except ValueError:
            arguments = raw
        calls.append({"name": call.get("name", ""), "arguments": arguments})
    if calls:
        out["tool_calls"] = calls
    return out


def _image_url(part: dict[str, Any]) -> str:
    source = part.get("image_url")
    return str(source.get("url", "") if isinstance(source, dict) else source or "")


def _path(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The nodes from a root to the last node, in order."""
    path: list[dict[str, Any]] = []
    at: int | None = len(nodes) - 1 if nodes else None
    while at is not None and 0 <= at < len(nodes) and len(path) <= len(nodes):
        path.append(nodes[at])
        at = nodes[at].get("parent")
    return path[::-1]


def read_v1_traces(path: str | Path) -> list[Outcome]:
    """The rollouts of a v1 ``traces.jsonl`` (written by verifiers, or by :func:`export_run`)."""
    out = []
    # JSON Lines end at "\n": splitlines would also split at a U+2028 a writer left raw.
    for line in Path(path).read_text(encoding="utf-8").split("\n"):
        if not line.strip():
            continue
        episode = json.loads(line)
        for trace in episode.get("traces", []):
            rewards = {
                k: None if v is None else float(v["score"])
                for k, v in trace.get("rewards", {}).items()
            }
            weights = {k: float(v["weight"]) for k, v in trace.get("rewards", {}).items() if v}
            nodes = trace.get("nodes", [])
            sampled = [n["message"] for n in nodes if n.get("sampled")]
            reply = str((sampled[-1].get("content") if sampled else "") or "").strip()
            along = _path(nodes)
            first = next((i for i, n in enumerate(along) if n.get("sampled")), len(along))
            messages = tuple(plain_message(n["message"]) for n in along)
            idx = (trace["task"].get("data") or {}).get("idx")
            out.append(
                Outcome(
                    key=trace["task"]["key"],
                    rewards=rewards,
                    metrics=dict(trace.get("metrics", {})),
                    reward=sum((s or 0.0) * weights[k] for k, s in rewards.items() if k in weights),
                    stop_condition=trace.get("stop_condition"),
                    reply=reply,
                    agent=str((trace.get("agent") or {}).get("name") or "agent"),
                    idx=idx if isinstance(idx, int) else None,
                    messages=messages,
                    completion=messages[first:],
                    errors=tuple(
                        f"{e.get('type')}: {e.get('message')}" for e in trace.get("errors", [])
                    ),
                )
            )
    return out
