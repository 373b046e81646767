"""An endpoint that answers errors, through the real ``vfray`` command and a real scripted model
server on 127.0.0.1: the preflight's one real call refuses a 500, a 400 and a 404 from a base
URL without ``/v1`` in one line quoting the answer; during a run a 400 is each rollout's own
``ProviderError`` (not retried, the circuit never opens); the progress line names the last
upstream error.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.test_cli_first_hour import LOCAL, one_error_line, vfray
from vfray.cli.preflight import check_endpoint
from vfray.endpoints import answers
from vfray.errors import ConfigError
from vfray.models.scripted.server import ScriptedModel, scripted_server
from vfray.run.driver import Progress
from vfray.run.progress import render

FAST_RETRIES = (
    "--retry.backoff", "0.01", "--retry.max-backoff", "0.05", "--retry.max-outage", "2",
)  # fmt: skip
"""Short waits, so that a run that did retry or hold (the old behaviour) still ends quickly
and fails on its rows rather than on a timeout."""


# -- the preflight -------------------------------------------------------------------------------


def test_preflight_refuses_an_endpoint_answering_500_in_one_line(tmp_path: Path) -> None:
    with scripted_server(ScriptedModel("arithmetic", fail=500)) as url:
        proc = vfray(
            "eval", "arithmetic", "-n", "2", *LOCAL, "-m", "scripted", "--base-url", url,
            "-o", str(tmp_path),
        )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-3000:]
    one_error_line(proc, f"{url}/chat/completions", "HTTP 500: scripted failure 500 (injected)")
    assert not list(tmp_path.iterdir())  # refused before any run folder


def test_preflight_quotes_a_400_and_hints_v1_for_a_404() -> None:
    with (
        scripted_server(ScriptedModel("echo", fail=400)) as url,
        pytest.raises(ConfigError) as refused,
    ):
        check_endpoint(url, None, model="scripted")
    line = str(refused.value)
    assert "\n" not in line
    assert "answered HTTP 400: scripted failure 400 (injected)" in line

    with scripted_server("echo") as url:
        root = url.removesuffix("/v1")
        with pytest.raises(ConfigError) as missing:
            check_endpoint(root, None, model="scripted")
        check_endpoint(url, None, model="scripted")  # the same server, with /v1, passes
    assert f"POST {root}/chat/completions answered HTTP 404: Not Found" in str(missing.value)
    assert f"--base-url {root}/v1?" in str(missing.value)


def test_preflight_sends_the_runs_sampling_and_lets_a_busy_endpoint_pass() -> None:
    model = ScriptedModel("echo")
    with scripted_server(model) as url:
        check_endpoint(url, None, model="m", sampling={"temperature": 0.5, "return_tokens": True})
        model.fail_next(429)
        check_endpoint(url, None, model="m")
    sent = [r.body for r in model.history]
    assert sent[0]["model"] == "m" and sent[0]["temperature"] == 0.5
    assert sent[0]["max_tokens"] == 1 and "return_tokens" not in sent[0]


# -- during the run ------------------------------------------------------------------------------


def _rows(out: Path) -> list[dict[str, object]]:
    parts = sorted(out.glob("**/traces/*.parquet"))
    assert parts, list(out.rglob("*"))
    return [row for part in parts for row in pq.read_table(part).to_pylist()]


def test_a_400_is_each_rollouts_own_error_never_an_outage(tmp_path: Path) -> None:
    proc = vfray(
        "eval", "arithmetic", "-n", "20", "-r", "2", *LOCAL, "-m", "scripted:echo?fail=400",
        "-o", str(tmp_path), *FAST_RETRIES,
    )  # fmt: skip
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    rows = _rows(tmp_path)
    # One row per rollout: none was retried (a retried attempt keeps its own row).
    assert len(rows) == 40
    assert {r["error_type"] for r in rows} == {"ProviderError"}
    for row in rows:
        assert "refused the request (HTTP 400)" in str(row["error_message"]), row
    # The last progress line: nothing retried, the circuit never opened, and the cause named.
    last = [line for line in proc.stderr.splitlines() if line.startswith("rollouts ")][-1]
    assert "retried 0" in last and "endpoint down" not in last, last
    assert "last upstream error: HTTP 400: scripted failure 400 (injected)" in last, last


def test_the_progress_line_names_a_500_from_the_endpoint(tmp_path: Path) -> None:
    proc = vfray(
        "eval", "arithmetic", "-n", "2", *LOCAL, "-m", "scripted:echo?fail=500",
        "-o", str(tmp_path), *FAST_RETRIES, "--retry.provider-retries", "0",
        "--retry.circuit-failures", "0",
    )  # fmt: skip
    last = [line for line in proc.stderr.splitlines() if line.startswith("rollouts ")][-1]
    assert "last upstream error: HTTP 500: scripted failure 500 (injected)" in last, last
    rows = _rows(tmp_path)
    assert all("upstream HTTP 500" in str(r["error_message"]) for r in rows), rows


def test_render_appends_the_last_upstream_error() -> None:
    progress = Progress(submitted=3, done=1, errored=1)
    progress.last_upstream_error = answers.short(
        'upstream HTTP 503: {"error": {"message": "the model   is\\nloading", "type": "x"}}'
    )
    line = render(progress, total=3, elapsed=1.0)
    assert line.endswith("  last upstream error: HTTP 503: the model is loading"), line
    assert "last upstream error" not in render(Progress(), total=3, elapsed=1.0)


def test_which_statuses_are_refusals() -> None:
    assert [s for s in (400, 401, 404, 408, 413, 422, 429, 500, 503) if answers.is_refusal(s)] == [
        400,
        401,
        404,
        413,
        422,
    ]
    assert answers.is_refused(answers.call_error(404, "no such model"))
    assert not answers.is_refused(answers.call_error(429, "slow down"))
