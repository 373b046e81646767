"""HTML building blocks of the viewer's pages: escaping, the page frame, tables, numbers, and a
generic renderer that shows any JSON value (so fields added to traces later appear unasked)."""

from __future__ import annotations

import html
import json
import math
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import urlencode

MAX_DEPTH = 6
"""Nesting shown as tables; deeper values are shown as JSON text."""


def esc(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def href(path: str, **params: object) -> str:
    query = urlencode({k: v for k, v in params.items() if v not in (None, "")})
    return esc(f"{path}?{query}" if query else path)


def num(value: object, digits: int = 3) -> str:
    if value is None:
        return "&ndash;"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "∞" if value > 0 else "&minus;∞"
        return f"{value:.{digits}g}" if abs(value) < 1e5 else f"{value:,.0f}"
    return esc(value)


def page(title: str, body: str, *, crumbs: Sequence[tuple[str, str]] = (), live: str = "") -> str:
    """A whole page. ``live`` is the URL the script polls to say the run changed."""
    trail = " &rsaquo; ".join(f'<a href="{esc(url)}">{esc(name)}</a>' for url, name in crumbs)
    poll = f' data-live="{esc(live)}"' if live else ""
    return (
        "<!doctype html>\n<html lang=en><head><meta charset=utf-8>"
        '<meta name=viewport content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)} · vfray view</title>"
        '<link rel=stylesheet href="/static/view.css"><script defer src="/static/view.js"></script>'
        f"</head><body{poll}><header><a class=brand href='/'>vfray view</a> {trail}"
        "<span id=live-banner hidden>the run has new rows: <a href=''>reload</a></span>"
        f"</header><main>{body}</main></body></html>"
    )


def table(head: Sequence[str], rows: Iterable[Sequence[str]], cls: str = "") -> str:
    """A table from cells that are already HTML."""
    header = "".join(f"<th>{h}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table class='{cls}'><thead><tr>{header}</tr></thead><tbody>{body}</tbody></table>"


def kv(pairs: Iterable[tuple[str, str]], cls: str = "kv") -> str:
    rows = "".join(f"<tr><th>{esc(k)}</th><td>{v}</td></tr>" for k, v in pairs)
    return f"<table class='{cls}'>{rows}</table>"


PROMPT_CHARS = 90
"""The prompt shown next to a task key: enough to tell tasks apart at a glance."""


def short_key(key: object) -> str:
    """A 64-character content hash (the key of a task given none) cut to its first 12."""
    text = "" if key is None else str(key)
    if len(text) == 64 and all(c in "0123456789abcdef" for c in text):
        return text[:12] + "…"
    return text


def task_label(key: object, prompt: object = None) -> str:
    """A task for people: a content hash key (a task without an explicit key) is cut to 12
    characters, its full value kept in the tooltip, and the prompt's start follows it."""
    text = "" if key is None else str(key)
    shown = short_key(text)
    words = " ".join(str(prompt).split()) if prompt else ""
    if len(words) > PROMPT_CHARS:
        words = words[: PROMPT_CHARS - 1] + "…"
    tail = f" <span class='dim prompt'>{esc(words)}</span>" if words else ""
    return f"<span class=key title='{esc(text)}'>{esc(shown)}</span>{tail}"


def note(text: str, cls: str = "note") -> str:
    return f"<p class='{cls}'>{esc(text)}</p>"


def pre(text: object, cls: str = "") -> str:
    return f"<pre class='{cls}'>{esc(text)}</pre>"


def as_json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


def value(data: Any, depth: int = 0) -> str:
    """Any JSON value: objects as key/value tables, lists of objects one under another,
    text as preformatted text when it spans lines."""
    if isinstance(data, dict):
        if not data:
            return "<span class=dim>{}</span>"
        if depth >= MAX_DEPTH:
            return pre(as_json(data))
        return kv((str(k), value(v, depth + 1)) for k, v in data.items())
    if isinstance(data, list):
        if not data:
            return "<span class=dim>[]</span>"
        if all(not isinstance(v, (dict, list)) for v in data):
            shown = ", ".join(esc(v) if isinstance(v, str) else num(v) for v in data[:200])
            return f"[{shown}{', …' if len(data) > 200 else ''}]"
        if depth >= MAX_DEPTH:
            return pre(as_json(data))
        return "".join(f"<div class=item>{value(v, depth + 1)}</div>" for v in data)
    if isinstance(data, str):
        return pre(data) if "\n" in data or len(data) > 200 else esc(data)
    if isinstance(data, (int, float)) or data is None:
        return num(data)
    return esc(data)


def histogram(
    values: Sequence[float], *, bins: int = 20, width: int = 480, height: int = 120
) -> str:
    """An inline SVG histogram (no script, no library)."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return "<p class=dim>no values</p>"
    low, high = min(finite), max(finite)
    if high == low:
        high = low + 1.0
    counts = [0] * bins
    for v in finite:
        counts[min(bins - 1, int((v - low) / (high - low) * bins))] += 1
    top = max(counts)
    bar = width / bins
    rects = []
    for i, count in enumerate(counts):
        h = 0 if not top else (height - 20) * count / top
        lo = low + (high - low) * i / bins
        hi = low + (high - low) * (i + 1) / bins
        rects.append(
            f"<rect x='{i * bar + 1:.1f}' y='{height - 14 - h:.1f}' width='{bar - 2:.1f}' "
            f"height='{h:.1f}'><title>{lo:.3g} &ndash; {hi:.3g}: {count}</title></rect>"
        )
    axis = (
        f"<text x='0' y='{height - 2}'>{low:.3g}</text>"
        f"<text x='{width}' y='{height - 2}' text-anchor='end'>{high:.3g}</text>"
        f"<text x='{width}' y='10' text-anchor='end'>max {top}</text>"
    )
    return (
        f"<svg class=hist width='{width}' height='{height}' viewBox='0 0 {width} {height}' "
        f"role=img aria-label='histogram'>{''.join(rects)}{axis}</svg>"
    )
