"""Shared by the tests that install real agent programs: registry reachability (skip with a
reason when offline), the tools root they reuse between runs, and the check of a rollout whose
call the interception refused."""

from __future__ import annotations

import functools
import shutil
import subprocess
import urllib.request

import pytest

import vfray as vf


@functools.cache
def _npm_reachable() -> str | None:
    npm = shutil.which("npm")
    if npm is None:
        return "npm is not installed"
    try:
        done = subprocess.run(
            [npm, "view", "is-number@7.0.0", "version", "--fetch-retries=0"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except subprocess.TimeoutExpired:
        return "the npm registry did not answer within 30s"
    return (
        None if done.returncode == 0 else f"the npm registry is unreachable: {done.stderr[-200:]}"
    )


@functools.cache
def _pypi_reachable() -> str | None:
    try:
        with urllib.request.urlopen("https://pypi.org/simple/six/", timeout=20) as answer:
            answer.read(64)
    except OSError as exc:
        return f"PyPI is unreachable: {exc}"
    return None


def need_registry(kind: str) -> None:
    """Skip the calling test when ``kind``'s registry (``npm`` or ``pypi``) is unreachable."""
    why = _npm_reachable() if kind == "npm" else _pypi_reachable()
    if why is not None:
        pytest.skip(why)


def check_ended_after_refusal(trace: vf.Trace, name: str) -> None:
    """``trace`` is a max_turns=1 rollout whose second call the interception refused: stopped
    for it after the one answered call, with no error, and the program ended within the stop
    grace rather than left retrying until the agent budget."""
    assert trace.stop_condition is vf.StopCondition.MAX_TURNS, (trace.stop_condition, trace.notes)
    assert trace.errors == [] and len(trace.calls) == 1, (trace.errors, len(trace.calls))
    assert not [note for note in trace.notes if "agent budget" in note], trace.notes
    after = trace.timing["agent"].end - trace.calls[-1].ended_at
    print(f"{name}: the agent phase ended {after:.1f}s after the refused call")
    assert after < 30, after  # a hang check, generous for a loaded machine
