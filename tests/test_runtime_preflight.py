"""Run-start checks of the runtime: a runtime that cannot start boxes here is refused with one
line before any rollout (real bwrap, a real docker socket path with no daemon), and a harness that
executes code on the subprocess runtime is warned about."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import vfray as vf
from vfray.errors import ConfigError, MissingExtraError
from vfray.farm import Farm
from vfray.harnesses.registry import make_harness
from vfray.runtimes.bwrap import BwrapRuntime
from vfray.runtimes.docker import DockerRuntime
from vfray.runtimes.modal import ModalRuntime
from vfray.runtimes.registry import preflight_runtime, runtime_warnings
from vfray.runtimes.subprocess import SubprocessRuntime
from vfray.tasksets.arithmetic import ArithmeticTaskset

NO_DAEMON = "unix:///nonexistent-vfray/docker.sock"


def test_code_executing_harness_on_subprocess_is_warned_about() -> None:
    bash, null = type(make_harness("bash", {})), type(make_harness("null", {}))
    (note,) = runtime_warnings(bash, "subprocess")
    assert "no isolation" in note and "'bwrap'" in note and "\n" not in note
    assert runtime_warnings(null, "subprocess") == []  # runs no code
    assert runtime_warnings(bash, "bwrap") == [] and runtime_warnings(bash, "docker") == []


def test_the_warning_is_logged_once_at_run_start(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="vfray.runtimes.registry"):
        vf.LocalEnvironment("scripted:echo", harness="bash", runtime="subprocess")
    notes = [r.getMessage() for r in caplog.records if "no isolation" in r.getMessage()]
    assert len(notes) == 1, caplog.records
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="vfray.runtimes.registry"):
        vf.LocalEnvironment("scripted:echo", harness="null", runtime="subprocess")
    assert not [r for r in caplog.records if "no isolation" in r.getMessage()]


def test_subprocess_preflight_is_a_no_op() -> None:
    SubprocessRuntime.preflight({})


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="no bwrap")
def test_bwrap_preflight_runs_a_real_box_and_names_a_missing_binary(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    BwrapRuntime.preflight({})  # bwrap works here
    empty = tempfile.mkdtemp(prefix="vfray-test-path-")
    try:
        monkeypatch.setenv("PATH", empty)
        with pytest.raises(ConfigError) as caught:
            BwrapRuntime.preflight({})
    finally:
        os.rmdir(empty)
    message = str(caught.value)
    assert message.startswith("bwrap runtime:") and "apt-get install bubblewrap" in message
    assert "\n" not in message


def test_docker_preflight_without_a_daemon_is_one_line() -> None:
    pytest.importorskip("docker", reason="the docker SDK is missing (pip install 'vfray[docker]')")
    with pytest.raises(ConfigError) as caught:
        DockerRuntime.preflight({"base_url": NO_DAEMON})
    message = str(caught.value)
    assert message.startswith(f"docker runtime: no Docker daemon at {NO_DAEMON}"), message
    assert "start dockerd" in message and "\n" not in message
    with pytest.raises(ConfigError, match="bad options"):
        DockerRuntime.preflight({"no_such_option": 1})


def test_modal_preflight_names_the_extra() -> None:
    try:
        import modal  # noqa: F401
    except ImportError:
        with pytest.raises(MissingExtraError, match=r"pip install 'vfray\[modal\]'"):
            ModalRuntime.preflight({})
    else:
        ModalRuntime.preflight({})


@pytest.mark.parametrize("backend", ["local", "ray"])
def test_no_docker_daemon_fails_the_run_before_any_rollout(tmp_path: Path, backend: str) -> None:
    pytest.importorskip("docker", reason="the docker SDK is missing (pip install 'vfray[docker]')")
    config = vf.EvalConfig.model_validate(
        {"env": {"runtime": {"type": "docker", "options": {"base_url": NO_DAEMON}}}}
    )
    farm = Farm(
        "scripted:arithmetic",
        config=config,
        harness="null",
        backend=backend,
        output_dir=str(tmp_path),
        progress=False,
    )
    with farm, pytest.raises(ConfigError, match="no Docker daemon at"):
        farm.run(ArithmeticTaskset(num_tasks=3), rollouts_per_task=2)
    assert not list(tmp_path.rglob("*.parquet"))  # no rollout ran, none failed


def test_cli_prints_the_one_line_error(tmp_path: Path) -> None:
    pytest.importorskip("docker", reason="the docker SDK is missing (pip install 'vfray[docker]')")
    code = (
        "import sys\nfrom vfray.cli.main import main\n"
        f"sys.exit(main(['eval', 'arithmetic', '-n', '3', '-r', '2', '--harness', 'null',"
        f" '--runtime', 'docker', '--env.runtime.options.base_url', {NO_DAEMON!r},"
        f" '--backend', 'local', '-o', {str(tmp_path)!r}, '--no-progress']))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "no Docker daemon at" in lines[0], proc.stderr
    assert not list(tmp_path.rglob("*.parquet"))


def test_a_driver_whose_boxes_run_elsewhere_does_not_check_its_own_engine() -> None:
    null = type(make_harness("null", {}))
    with pytest.raises(ConfigError, match="no Docker daemon"):
        preflight_runtime(null, "docker", {"base_url": NO_DAEMON})
    preflight_runtime(null, "docker", {"base_url": NO_DAEMON}, boxes_here=False)
