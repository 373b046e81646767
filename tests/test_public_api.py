"""The public surface: a small sorted ``__all__``, no Ray on ``import vfray``, and a configuration
reference (docs/reference/configuration.md) that matches the config tree."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import vfray

REPO = Path(__file__).resolve().parents[1]


INTENDED = [
    "Agent",
    "Branch",
    "ConfigError",
    "Episode",
    "EvalConfig",
    "Farm",
    "Harness",
    "HarnessConfig",
    "HarnessError",
    "InterceptionError",
    "Judge",
    "LocalEnvironment",
    "McpServer",
    "Message",
    "ModelCall",
    "ModelEndpoint",
    "ProviderError",
    "RunResult",
    "Runtime",
    "SandboxError",
    "Seat",
    "SeatedTask",
    "SimulatedUser",
    "StopCondition",
    "Task",
    "TaskData",
    "TaskError",
    "Taskset",
    "TasksetError",
    "Toolset",
    "Trace",
    "Turn",
    "VfrayError",
    "finalize_episode",
    "group_reward",
    "intercept",
    "make_runtime",
    "metric",
    "read_traces",
    "reward",
    "run_episode",
    "run_rollout",
    "stop",
    "to_samples",
    "tool",
    "user",
    "write_traces",
]
"""The public surface, name for name: a change here is a change of the API."""


def test_all_is_exactly_the_intended_surface() -> None:
    assert vfray.__all__ == INTENDED
    # A user writes a harness by subclassing, and catches every vfray failure with one class.
    assert issubclass(vfray.ConfigError, vfray.VfrayError)
    assert vfray.Harness.config_type is vfray.HarnessConfig


def test_all_is_sorted_small_and_resolvable() -> None:
    assert vfray.__all__ == sorted(vfray.__all__)
    # What a taskset author writes: the task model, scoring, tools, users, judges, seats.
    assert len(vfray.__all__) <= 50
    for name in vfray.__all__:
        assert getattr(vfray, name) is not None, name


def test_import_vfray_does_not_import_ray() -> None:
    code = "import sys, vfray; print('ray' in sys.modules, 'aiohttp' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_docs_config_reference_is_current() -> None:
    generated = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gen_config_reference.py")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    page = REPO / "docs" / "reference" / "configuration.md"
    assert generated in page.read_text(), (
        "docs/reference/configuration.md is stale: paste the output of "
        "scripts/gen_config_reference.py"
    )
