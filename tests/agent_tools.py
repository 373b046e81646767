"""Shared by the tests that install real agent programs: registry reachability (skip with a
reason when offline) and the tools root they reuse between runs."""

from __future__ import annotations

import functools
import shutil
import subprocess
import urllib.request

import pytest


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
