"""Harness mistakes refused up front, each in one line: a misspelt option (with the closest
name), and a task that continues (a user, or next_message) given to a harness that cannot
resume (naming the ones that can)."""

from __future__ import annotations

from pathlib import Path

import pytest

import vfray as vf
from vfray.errors import ConfigError, IncompatibleError
from vfray.harnesses import make_harness
from vfray.harnesses.provisioned import ProvisionedHarness
from vfray.harnesses.registry import resumable_harnesses
from vfray.run.environment import LocalEnvironment
from vfray.runtimes.provision import MANIFEST, installer_path


def test_a_misspelt_harness_option_is_one_line_with_the_closest_name() -> None:
    with pytest.raises(ConfigError) as caught:
        make_harness("mini-swe-agent", {"max_step": 3, "versoin": "1"})
    message = str(caught.value)
    assert "\n" not in message
    assert "unknown option 'max_step' (did you mean 'max_steps'?)" in message
    assert "unknown option 'versoin' (did you mean 'version'?)" in message
    assert "its options: command_timeout, env," in message
    with pytest.raises(ConfigError) as caught:
        make_harness("bash", {"max_steps": 0})
    assert str(caught.value) == (
        "invalid config for harness 'bash': max_steps: Input should be greater than 0"
    )


class Continues(vf.Task[vf.TaskData]):
    """No declared user: the task itself says the next message."""

    def next_message(self, trace: vf.Trace) -> str | None:
        return "and now?" if len(trace.segments) < 2 else None


def test_a_task_that_continues_is_refused_for_a_harness_that_cannot_resume() -> None:
    resumable = resumable_harnesses()
    assert {"bash", "null", "claude-code-acp", "codex-acp"} <= set(resumable)
    assert not {"mini-swe-agent", "openclaw"} & set(resumable)
    env = LocalEnvironment("scripted:echo", harness="mini-swe-agent")
    with pytest.raises(IncompatibleError) as caught:
        env.spec.check_task_type(Continues, 1)
    message = str(caught.value)
    assert "\n" not in message and "harness 'mini-swe-agent' cannot resume" in message
    assert "'claude-code-acp'" in message and "'bash'" in message
    env.spec.check_task_type(vf.Task, 1)  # a task that ends after its first segment: fine
    LocalEnvironment("scripted:echo", harness="bash").spec.check_task_type(Continues, 1)


async def test_an_episode_is_refused_before_any_box_starts() -> None:
    task = Continues(vf.TaskData(prompt="hi"))
    with pytest.raises(IncompatibleError, match="cannot resume"):
        await vf.run_episode(task, 1, model="scripted:echo", harness="openclaw")


async def test_an_agent_that_cannot_be_installed_here_is_refused_before_the_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """No npm and no node on PATH and codex not in the (empty) tool dir: one line at start,
    not one failed rollout after another."""
    monkeypatch.setenv("VFRAY_TOOLS_DIR", str(tmp_path / "tools"))
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert installer_path("npm") is None and installer_path("node") is None
    task = vf.Task(vf.TaskData(prompt="hi"))
    with pytest.raises(ConfigError) as caught:
        await vf.run_rollout(task, model="scripted:agent", harness="codex")
    message = str(caught.value)
    assert "\n" not in message
    assert "harness 'codex' installs @openai/codex@" in message
    assert "no npm, no node on PATH" in message
    # The same harness with its agent already in the tool dir needs neither.
    harness = make_harness("codex")
    assert isinstance(harness, ProvisionedHarness)
    done = tmp_path / "tools" / harness.tool_spec().key
    done.mkdir(parents=True)
    (done / MANIFEST).write_text("{}")
    harness.preflight("subprocess")
    make_harness("bash").preflight("subprocess")  # the chat loop installs nothing


def test_codex_agents_bring_their_own_node() -> None:
    for harness_id in ("codex", "codex-acp", "claude-code", "claude-code-acp"):
        harness = make_harness(harness_id)
        assert isinstance(harness, ProvisionedHarness)
        assert "node@22" in harness.tool_spec().packages
