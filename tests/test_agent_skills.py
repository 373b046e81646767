"""Agent skills: SKILL.md folders from the harness's ``skills`` option installed where each agent
discovers them (claude-code: ``$CLAUDE_CONFIG_DIR/skills``; codex: ``$CODEX_HOME/skills``; the
ACP forms use the same homes), executable bits kept, and refused in one line by a harness that
cannot load them. The real agents (npm) are checked to offer the skill to the model; terminus-2's
own program is checked in tests/test_agent_terminus_2.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from agent_tools import need_registry

import vfray as vf
from vfray.errors import ConfigError
from vfray.harnesses import make_harness
from vfray.harnesses.base import SKILL_HARNESSES
from vfray.harnesses.registry import available_harnesses, harness_class
from vfray.runtimes.base import Runtime

DESCRIPTION = "Counts the vowels of a word with the bundled script (a vfray test skill)."


def make_skill(root: Path) -> Path:
    skill = root / "vowel-counter"
    (skill / "scripts").mkdir(parents=True)
    (skill / "SKILL.md").write_text(
        f"---\nname: vowel-counter\ndescription: {DESCRIPTION}\n---\n\n"
        "Run `scripts/count.sh WORD` and report its output.\n"
    )
    script = skill / "scripts" / "count.sh"
    script.write_text('#!/bin/sh\necho "$1" | tr -cd aeiou | wc -c\n')
    script.chmod(0o755)
    return skill


class SeesSkill(vf.Task[vf.TaskData]):
    skills_dir = ""

    @vf.metric
    async def installed(self, runtime: Runtime) -> float:
        base = f"{self.skills_dir}/vowel-counter"
        modes = await runtime.run(
            ["stat", "-c", "%a", f"{base}/SKILL.md", f"{base}/scripts/count.sh"]
        )
        counted = await runtime.run([f"{base}/scripts/count.sh", "banana"])
        return float(modes.stdout.split() == ["644", "755"] and counted.stdout.strip() == "3")


def test_a_harness_without_skills_refuses_them_in_one_line(tmp_path: Path) -> None:
    skill = make_skill(tmp_path)
    with pytest.raises(ConfigError) as caught:
        make_harness("mini-swe-agent", {"skills": [str(skill)]})
    assert str(caught.value) == (
        "harness 'mini-swe-agent' cannot load skills (no SUPPORTS_SKILLS); use one of "
        "claude-code, claude-code-acp, codex, codex-acp, gemini-cli, hermes-agent, kimi-code, "
        "openclaw, opencode, pi, qwen-code, terminus-2"
    )
    # The refusal names exactly the built-ins that can: none missing, none extra.
    can = [h for h in available_harnesses() if harness_class(h).SUPPORTS_SKILLS]
    assert tuple(can) == SKILL_HARNESSES
    for harness_id in SKILL_HARNESSES:
        assert make_harness(harness_id, {"skills": [str(skill)]}).SUPPORTS_SKILLS


def _request_text(trace: vf.Trace) -> str:
    call = trace.calls[0]
    parts: list[Any] = [trace.graph[i].model_dump() for i in call.request_ids]
    parts.append(call.tools or [])
    return json.dumps(parts)


@pytest.mark.slow
@pytest.mark.parametrize("harness_id", ["codex", "claude-code"])
async def test_the_agent_finds_the_skill_in_its_own_folder(harness_id: str, tmp_path: Path) -> None:
    need_registry("npm")
    harness = make_harness(harness_id, {"skills": [str(make_skill(tmp_path))]})
    task = SeesSkill(vf.TaskData(prompt='Write "ok" to done.txt'))
    task.skills_dir = harness.SKILLS_DIR  # type: ignore[attr-defined]
    trace = await vf.run_rollout(
        task,
        model="scripted:agent",
        harness=harness_id,
        harness_options={"skills": [str(tmp_path / "vowel-counter")]},
    )
    assert trace.errors == [], trace.errors
    assert trace.metrics["installed"] == 1.0
    assert DESCRIPTION in _request_text(trace)
