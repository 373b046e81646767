"""One rollout's page, rendered from the trace's own JSON: the conversation of every branch
(system, user, assistant, tool calls and results, reasoning), each model call's usage (token ids
and logprobs fetched on demand), stop condition, errors with their phase, kept artifacts, and
every field this viewer does not know, shown as it is."""

from __future__ import annotations

import contextlib
import json
from typing import Any

from vfray.view._html import as_json, esc, href, kv, num, pre, table, value

KNOWN_TRACE = frozenset(
    {
        "trace_id", "run_id", "episode_id", "rollout_index", "attempt", "task", "agent", "graph",
        "branch_list", "calls", "rewards", "metrics", "advantage", "stop_condition", "errors",
        "notes", "artifacts", "timing", "segments", "created_at", "reward", "usage",
    }
)  # fmt: skip
KNOWN_MESSAGE = frozenset(
    {"role", "content", "name", "tool_calls", "tool_call_id", "reasoning_content"}
)
KNOWN_CALL = frozenset(
    {
        "index", "dialect", "model", "sampling", "request_ids", "response_id", "branch", "usage",
        "started_at", "ended_at", "finish_reason", "streamed", "error", "policy_version", "tools",
        "prompt_token_ids", "completion_token_ids", "completion_logprobs",
    }
)  # fmt: skip
TOKEN_FIELDS = ("prompt_token_ids", "completion_token_ids", "completion_logprobs")


def _content(content: Any) -> str:
    if content is None or content == "":
        return ""
    if isinstance(content, str):
        return pre(content, "text")
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(pre(part["text"], "text"))
            elif _image_url(part):
                parts.append(_image(_image_url(part)))
            elif isinstance(part, str):
                parts.append(pre(part, "text"))
            else:
                parts.append(f"<div class=part>{value(part)}</div>")
        return "".join(parts)
    return value(content)


def _image_url(part: Any) -> str:
    """The URL of a chat ``image_url`` part (how every dialect records an image), else ''."""
    source = part.get("image_url") if isinstance(part, dict) else None
    url = source.get("url") if isinstance(source, dict) else None
    return url if isinstance(url, str) else ""


def _image(url: str) -> str:
    # An image the trace carries is shown; one on the web is only linked (opening a trace
    # must not fetch from elsewhere), its URL cut short.
    if url.startswith("data:image/"):
        return f'<div class=part><img alt=image style="max-width:100%" src="{esc(url)}"></div>'
    if url.startswith(("https://", "http://")):
        link = f'<a href="{esc(url)}" rel=noreferrer>{esc(url[:200])}</a>'
        return f"<div class=part>image: {link}</div>"
    return f"<div class=part>image: {esc(url[:200])}</div>"


def _tool_call(call: Any) -> str:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        return f"<div class=toolcall>{value(call)}</div>"
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        with contextlib.suppress(ValueError):
            arguments = as_json(json.loads(arguments))
    else:
        arguments = as_json(arguments)
    return (
        f"<div class=toolcall><span class=tag>tool call</span> <b>{esc(function.get('name'))}</b>"
        f" <span class=dim>{esc(call.get('id'))}</span>{pre(arguments)}</div>"
    )


def message_html(message: dict[str, Any], call: dict[str, Any] | None = None) -> str:
    role = str(message.get("role") or "?")
    head = f"<span class=role>{esc(role)}</span>"
    if message.get("name"):
        head += f" <span class=dim>{esc(message['name'])}</span>"
    if message.get("tool_call_id"):
        head += f" <span class=dim>result of {esc(message['tool_call_id'])}</span>"
    if call is not None:
        usage = call.get("usage") or {}
        head += (
            f" <span class=usage>call #{esc(call.get('index'))} · "
            f"{num(usage.get('input_tokens'))} in / {num(usage.get('output_tokens'))} out · "
            f"{esc(call.get('finish_reason') or '')}</span>"
        )
    body = []
    if message.get("reasoning_content"):
        body.append(
            "<details class=reasoning><summary>reasoning</summary>"
            f"{pre(message['reasoning_content'])}</details>"
        )
    body.append(_content(message.get("content")))
    body.extend(_tool_call(c) for c in message.get("tool_calls") or [])
    extra = {k: v for k, v in message.items() if k not in KNOWN_MESSAGE}
    if extra:
        body.append(f"<div class=extra>{value(extra)}</div>")
    return f"<div class='msg role-{esc(role)}'><div class=head>{head}</div>{''.join(body)}</div>"


def conversation(trace: dict[str, Any], compact: bool = False) -> str:
    """Every branch's messages, the final branch (the last call's) first and open."""
    graph: dict[str, Any] = trace.get("graph") or {}
    calls: list[dict[str, Any]] = trace.get("calls") or []
    by_response = {c.get("response_id"): c for c in calls if c.get("response_id")}
    branches: list[dict[str, Any]] = trace.get("branch_list") or []
    last = calls[-1].get("branch") if calls else None
    ordered = sorted(branches, key=lambda b: b.get("id") != last)
    out = []
    for branch in ordered:
        ids = branch.get("message_ids") or []
        messages = "".join(
            message_html(graph.get(mid) or {"role": "?", "content": f"(missing {mid})"},
                         by_response.get(mid))
            for mid in ids
        )  # fmt: skip
        label = f"branch {esc(branch.get('id'))}: {len(ids)} messages, calls " + esc(
            ", ".join(str(i) for i in branch.get("call_indices") or [])
        )
        is_open = " open" if branch.get("id") == last or len(ordered) == 1 else ""
        if compact:
            return f"<div class=conv>{messages}</div>"
        out.append(f"<details class=branch{is_open}><summary>{label}</summary>{messages}</details>")
    if not out:
        return "<p class=dim>no model call was recorded</p>"
    return "".join(out)


def _calls(api: str, trace: dict[str, Any]) -> str:
    rows = []
    for call in trace.get("calls") or []:
        usage = call.get("usage") or {}
        latency = None
        if isinstance(call.get("ended_at"), (int, float)) and isinstance(
            call.get("started_at"), (int, float)
        ):
            latency = max(0.0, call["ended_at"] - call["started_at"])
        error = call.get("error")
        tokens = sum(len(call.get(f) or []) for f in TOKEN_FIELDS)
        lazy = (
            f"<details class=tokens data-src='{esc(api)}/call/{esc(call.get('index'))}'>"
            f"<summary>{num(tokens)} values</summary><div class=slot>loading…</div></details>"
            if tokens
            else "<span class=dim>none</span>"
        )
        other = {k: v for k, v in call.items() if k not in KNOWN_CALL}
        rows.append(
            [
                num(call.get("index")),
                num(call.get("branch")),
                esc(call.get("model")),
                esc(call.get("dialect")),
                esc(call.get("finish_reason")),
                f"{num(usage.get('input_tokens'))} / {num(usage.get('output_tokens'))}",
                num(latency),
                num(call.get("policy_version")),
                f"<span class=err>{esc(error.get('type'))}: {esc(error.get('message'))}</span>"
                if isinstance(error, dict)
                else "",
                lazy,
                value({k: v for k, v in call.items() if k in ("sampling", "tools") and v})
                + (value(other) if other else ""),
            ]
        )
    if not rows:
        return "<p class=dim>no model calls</p>"
    head = ["#", "branch", "model", "dialect", "finish", "tokens in / out", "latency s",
            "policy", "error", "token ids & logprobs", "sampling, tools, other"]  # fmt: skip
    return f"<div class=scroll>{table(head, rows, 'calls')}</div>"


def _timing(trace: dict[str, Any]) -> str:
    timing: dict[str, Any] = trace.get("timing") or {}
    starts = [t.get("start") for t in timing.values() if isinstance(t, dict)]
    origin = min((s for s in starts if isinstance(s, (int, float))), default=0.0)
    rows = []
    for name, span in timing.items():
        start, end = span.get("start"), span.get("end")
        duration = end - start if isinstance(end, (int, float)) and start is not None else None
        rows.append([esc(name), num((start or origin) - origin), num(duration)])
    for i, span in enumerate(trace.get("segments") or []):
        start, end = span.get("start"), span.get("end")
        duration = end - start if isinstance(end, (int, float)) and start is not None else None
        rows.append([f"segment {i}", num((start or origin) - origin), num(duration)])
    return table(["phase", "starts at s", "takes s"], rows) if rows else ""


def rollout_page(base: str, api: str, trace: dict[str, Any], columns: dict[str, Any]) -> str:
    task: dict[str, Any] = trace.get("task") or {}
    key = task.get("key") or columns.get("task_key")
    agent = trace.get("agent") or {}
    stop = trace.get("stop_condition") or columns.get("stop_condition")
    reward = columns.get("reward", trace.get("reward"))
    facts = [
        ("task", f"<a href='{href(base + '/episode', task=key)}'>{esc(key)}</a>"),
        ("rollout / attempt", f"{num(trace.get('rollout_index'))} / {num(trace.get('attempt'))}"),
        ("reward", num(reward)),
        ("advantage", num(trace.get("advantage", columns.get("advantage")))),
        (
            "stop condition",
            f"<span id=stop>{esc(stop)}</span>"
            + (" (terminated)" if columns.get("terminated") else "")
            + (" (truncated)" if columns.get("truncated") else ""),
        ),
        ("model", esc(agent.get("model") or columns.get("model"))),
        ("harness / runtime", f"{esc(agent.get('harness'))} / {esc(agent.get('runtime'))}"),
        ("trace id", esc(trace.get("trace_id") or columns.get("trace_id"))),
    ]
    errors = trace.get("errors") or []
    error_rows = [
        [
            f"<span class=err>{esc(e.get('type'))}</span>",
            esc(e.get("phase")),
            pre(e.get("message")),
            f"<details><summary>detail</summary>{pre(e['detail'])}</details>"
            if e.get("detail")
            else "",
        ]
        for e in errors
        if isinstance(e, dict)
    ]
    rewards = [
        [esc(name), num(r.get("value")), num(r.get("weight")), num(r.get("group")),
         esc(r.get("error"))]
        for name, r in (trace.get("rewards") or {}).items()
        if isinstance(r, dict)
    ]  # fmt: skip
    metrics = [[esc(k), num(v)] for k, v in (trace.get("metrics") or {}).items()]
    artifacts = "".join(
        f"<details class=artifact><summary>{esc(a.get('name'))}"
        f"{' (truncated)' if a.get('truncated') else ''}</summary>{pre(a.get('content'))}</details>"
        for a in trace.get("artifacts") or []
        if isinstance(a, dict)
    )
    other = {k: v for k, v in trace.items() if k not in KNOWN_TRACE}
    sections = [
        f"<h1>Rollout #{num(trace.get('rollout_index'))} of {esc(key)}</h1>",
        f"<div class=cards><section>{kv(facts)}</section>",
        "<section><h2>Rewards</h2>"
        + (table(["name", "value", "weight", "group", "error"], rewards) if rewards else "&ndash;")
        + "<h2>Metrics</h2>"
        + (table(["name", "value"], metrics) if metrics else "&ndash;")
        + "</section></div>",
    ]
    if error_rows:
        sections.append(
            "<section id=errors><h2>Errors</h2>"
            + table(["type", "phase", "message", ""], error_rows)
            + "</section>"
        )
    if trace.get("notes"):
        sections.append("<section><h2>Notes</h2>" + value(trace["notes"]) + "</section>")
    sections += [
        f"<section id=conversation><h2>Conversation</h2>{conversation(trace)}</section>",
        f"<section><h2>Model calls</h2>{_calls(api, trace)}</section>",
        f"<section><h2>Timing</h2>{_timing(trace)}</section>",
        "<section><details><summary>Task data</summary>"
        f"{value(task.get('data') or {})}</details></section>",
    ]
    if artifacts:
        sections.append(f"<section id=artifacts><h2>Artifacts</h2>{artifacts}</section>")
    if other:
        sections.append(f"<section id=other><h2>Other fields</h2>{value(other)}</section>")
    sections.append(
        "<section><details><summary>Stored columns</summary>"
        + kv((k, value(v)) for k, v in columns.items())
        + "</details></section>"
    )
    return "".join(sections)


def tokens(trace: dict[str, Any], index: int) -> dict[str, Any]:
    """One call's token ids and logprobs (the JSON the page fetches on demand)."""
    for call in trace.get("calls") or []:
        if call.get("index") == index:
            return {f: call.get(f) for f in TOKEN_FIELDS}
    return {}
