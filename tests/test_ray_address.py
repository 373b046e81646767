"""A wrong ``--address`` ends in one line within seconds: nothing listening there (``ray.init``
waited more than 4 minutes, printing only C++ warnings), and a cluster with token auth reached
without RAY_AUTH_MODE (``ray.init`` retried for 20 s, then said "Failed to connect" with a hint
about ``--backend local``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.ray_head import free_port, ray_head
from tests.test_cli import cli_env


def eval_at(address: str, out: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in cli_env().items() if not k.startswith("RAY_AUTH")}
    return subprocess.run(
        [sys.executable, "-m", "vfray", "eval", "arithmetic", "-n", "1", "-r", "2",
         "--harness", "null", "--address", address, "-o", str(out), "--no-progress"],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip


def the_error(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "gcs_client" not in proc.stderr and "core_worker" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("vfray: error:")]
    assert len(errors) == 1, proc.stderr[-3000:]
    return errors[0]


def test_an_address_where_nothing_listens_is_one_line(tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    line = the_error(eval_at(address, tmp_path))
    assert f"cannot reach the Ray cluster at {address}" in line, line


def test_a_token_cluster_without_ray_auth_mode_names_the_token(tmp_path: Path) -> None:
    with ray_head() as head:
        address = head.markers[1]  # the head's GCS, 127.0.0.1:<port>
        line = the_error(eval_at(address, tmp_path))
    assert "requires token authentication" in line and "RAY_AUTH_MODE=token" in line, line
    assert "--backend local" not in line
