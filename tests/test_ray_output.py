"""What a Ray run prints: the quick start's output holds no Ray ``ERROR`` line (Ray's C++ log
lines carry `` E `` after the timestamp). The SandboxHosts used to be created with the model
actor's URL as an ObjectRef, which Ray logs as "constructor arguments in the object store and
max_restarts > 0" for every host."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.test_cli import cli_env

RAY_ERROR = re.compile(r"^\[[^\]]* E \d+ \d+\]|\bERROR\b.*core_worker", re.MULTILINE)


def test_a_ray_run_prints_no_ray_error_line(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "vfray", "eval", "arithmetic", "-n", "2", "-r", "2",
         "--harness", "null", "-o", str(tmp_path), "--no-progress"],
        capture_output=True, text=True, env=cli_env(), timeout=300, check=False,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "4 / 4" in proc.stdout, proc.stdout
    assert not RAY_ERROR.search(out), out[-3000:]
    assert "object store" not in out, out[-3000:]
