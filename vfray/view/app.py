"""The viewer's web app (starlette): one route per page plus two small JSON routes (the run's
change stamp, polled to follow a run being written; one call's token ids and logprobs).

Every page is built on the server from the run folder; a problem with the folder is a page
that says so, and an unexpected failure is a one-line page (its traceback goes to the log only).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from vfray.view._html import esc, href, note, page, short_key
from vfray.view.groups import compare_page, episode_page, tasks_page
from vfray.view.rollout import rollout_page, tokens
from vfray.view.rollouts import Filters, list_page
from vfray.view.runs import RunFolder, Snapshot
from vfray.view.summary import notes_html, problem_html, summary_page

log = logging.getLogger(__name__)
STATIC = Path(__file__).parent / "static"


class NotFound(Exception):
    """A page for something the run does not have (a trace id, a run index)."""


def _html(title: str, body: str, crumbs: list[tuple[str, str]], status: int = 200,
          live: str = "") -> HTMLResponse:  # fmt: skip
    return HTMLResponse(page(title, body, crumbs=crumbs, live=live), status_code=status)


def create_app(run_dirs: Sequence[Path], *, warm: bool = False) -> Starlette:
    """The app over these run folders (run ``i`` is served under ``/run/i``); ``warm`` reads
    them now (and the imports that takes) rather than on the first page asked for."""
    runs = [RunFolder(Path(p).absolute()) for p in run_dirs]
    if warm:
        for run in runs:
            run.snapshot()

    def run_of(request: Request) -> tuple[int, RunFolder]:
        raw = str(request.path_params["run"])
        if not raw.isdigit() or int(raw) >= len(runs):
            raise NotFound(f"there is no run {raw} here (runs: 0..{len(runs) - 1})")
        return int(raw), runs[int(raw)]

    def run_page(
        build: Callable[[str, RunFolder, Snapshot, Request], tuple[str, str]],
    ) -> Callable[[Request], Response]:
        """A page about one run: the snapshot is taken once, problems shown instead of it."""

        def endpoint(request: Request) -> Response:
            try:
                index, run = run_of(request)
                snap = run.snapshot()
                base = f"/run/{index}"
                crumbs = [(base, snap.title)]
                live = f"/api/run/{index}/stamp?seen={snap.stamp}"
                if snap.problem is not None:
                    return _html(snap.title, problem_html(snap) + notes_html(snap), crumbs)
                title, body = build(base, run, snap, request)
                if title != snap.title:
                    crumbs.append((str(request.url.path), title))
                return _html(title, notes_html(snap) + body if title != snap.title else body,
                             crumbs, live=live)  # fmt: skip
            except NotFound as exc:
                return _html("not found", f"<h1>Not found</h1>{note(str(exc))}", [], 404)
            except Exception as exc:
                log.exception("vfray view: %s failed", request.url.path)
                text = f"{type(exc).__name__}: {' '.join(str(exc).split())[:500]}"
                body = (
                    "<h1>This page could not be shown</h1>"
                    f"{note(text, 'note warn')}<p>The server's log has the details.</p>"
                )
                return _html("error", body, [], 500)

        return endpoint

    def summary(base: str, run: RunFolder, snap: Snapshot, request: Request) -> tuple[str, str]:
        return snap.title, summary_page(base, snap)

    def rollouts(base: str, run: RunFolder, snap: Snapshot, request: Request) -> tuple[str, str]:
        return "rollouts", list_page(base, run, snap, Filters.parse(request.query_params))

    def tasks(base: str, run: RunFolder, snap: Snapshot, request: Request) -> tuple[str, str]:
        return "tasks", tasks_page(base, snap)

    def episode(base: str, run: RunFolder, snap: Snapshot, request: Request) -> tuple[str, str]:
        key = request.query_params.get("task", "")
        return f"episode {short_key(key)}", episode_page(base, run, snap, key)

    def locate(snap: Snapshot, trace_id: str) -> tuple[int, int]:
        found = snap.rows.filter(pc.equal(snap.rows.column("trace_id"), trace_id))
        if found.num_rows == 0:
            raise NotFound(f"this run has no rollout with trace id {trace_id}")
        row = found.slice(0, 1).to_pylist()[0]
        return int(row["_part"]), int(row["_row"])

    def rollout(base: str, run: RunFolder, snap: Snapshot, request: Request) -> tuple[str, str]:
        trace_id = str(request.path_params["trace_id"])
        part, row = locate(snap, trace_id)
        trace = run.trace_json(snap, part, row)
        columns = run.row_values(snap, part, row)
        api = f"/api{base}/rollout/{trace_id}"
        title = f"rollout {short_key(columns.get('task_key'))} #{columns.get('rollout_index')}"
        return title, rollout_page(base, api, trace, columns)

    def stamp(request: Request) -> Response:
        try:
            _, run = run_of(request)
        except NotFound as exc:
            return JSONResponse({"error": str(exc)}, 404)
        snap = run.snapshot()
        return JSONResponse({"stamp": snap.stamp, "rows": snap.rows.num_rows})

    def call_tokens(request: Request) -> Response:
        try:
            _, run = run_of(request)
            snap = run.snapshot()
            part, row = locate(snap, str(request.path_params["trace_id"]))
        except NotFound as exc:
            return JSONResponse({"error": str(exc)}, 404)
        index = int(request.path_params["call"])
        return JSONResponse(tokens(run.trace_json(snap, part, row), index))

    def index(request: Request) -> Response:
        if len(runs) == 1:
            return RedirectResponse("/run/0", 302)
        rows = []
        for i, run in enumerate(runs):
            snap = run.snapshot()
            state = snap.problem or f"{snap.final.num_rows:,} rollouts"
            rows.append(f"<li><a href='/run/{i}'>{esc(snap.title)}</a> <span class=dim>"
                        f"{esc(run.path)} · {esc(state)}</span></li>")  # fmt: skip
        compare = "".join(
            f"<li><a href='{href('/compare', a=0, b=j)}'>compare run 0 with run {j}</a></li>"
            for j in range(1, len(runs))
        )
        body = f"<h1>Runs</h1><ol start=0>{''.join(rows)}</ol><h2>Compare</h2><ul>{compare}</ul>"
        return _html("runs", body, [])

    def compare(request: Request) -> Response:
        params = request.query_params
        a, b = params.get("a", "0"), params.get("b", "1")
        if not (a.isdigit() and b.isdigit() and max(int(a), int(b)) < len(runs)):
            body = note(f"compare needs two runs a and b among 0..{len(runs) - 1}")
            return _html("compare", f"<h1>Compare runs</h1>{body}", [], 404)
        snaps = [run.snapshot() for run in runs]
        problems = [s for s in (snaps[int(a)], snaps[int(b)]) if s.problem]
        if problems:
            return _html("compare", "".join(problem_html(s) for s in problems), [])
        names = [s.title for s in snaps]
        return _html("compare", compare_page(names, snaps, int(a), int(b)), [("/", "runs")])

    routes: list[Any] = [
        Route("/", index),
        Route("/compare", compare),
        Route("/run/{run}", run_page(summary)),
        Route("/run/{run}/rollouts", run_page(rollouts)),
        Route("/run/{run}/episodes", run_page(tasks)),
        Route("/run/{run}/episode", run_page(episode)),
        Route("/run/{run}/rollout/{trace_id}", run_page(rollout)),
        Route("/api/run/{run}/stamp", stamp),
        Route("/api/run/{run}/rollout/{trace_id}/call/{call:int}", call_tokens),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    return Starlette(routes=routes)
