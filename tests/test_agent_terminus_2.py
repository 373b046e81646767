"""terminus-2 (terminal-bench's reference agent) as vfray's in-box program: a real tmux session
in the box, the scripted ``agent`` model answering its JSON format from the task's plan, scored
by the file the keystrokes wrote; in bwrap and docker, and stopped by a refused call."""

from __future__ import annotations

import glob
import importlib.util
import json
import shutil
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import vfray as vf
from vfray import harnesses
from vfray.harnesses import make_harness
from vfray.harnesses.terminus_2 import Terminus2Config, Terminus2Harness
from vfray.interception import Limits
from vfray.rollout import Timeouts
from vfray.runtimes.base import Runtime

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="no tmux on this machine")

PROMPT = 'Write "hello terminus" to out.txt, then check it.'


class WriteFile(vf.Task[vf.TaskData]):
    left: list[str] = []
    """What the rollout left in the box's .vfray (the last rollout's)."""

    @vf.reward
    async def wrote_it(self, runtime: Runtime) -> bool:
        listed = await runtime.run(["find", ".vfray", "-mindepth", "1"])
        WriteFile.left = sorted(listed.stdout.split())
        return (await runtime.read("out.txt")) == b"hello terminus\n"


def _program() -> ModuleType:
    path = Path(harnesses.__file__).parent / "programs" / "terminus_loop.py"
    spec = importlib.util.spec_from_file_location("terminus_loop", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def _rollout(runtime: str, **options: Any) -> vf.Trace:
    data = vf.TaskData(prompt=PROMPT, workdir="/box" if runtime == "bwrap" else None)
    return await vf.run_rollout(
        WriteFile(data), model="scripted:agent", harness="terminus-2", runtime=runtime, **options
    )


def _check_solved(trace: vf.Trace) -> None:
    assert trace.errors == [], trace.errors
    assert trace.stop_condition is vf.StopCondition.COMPLETED
    assert trace.rewards["wrote_it"].value == 1.0
    # write, cat, task_complete, its confirmation: four chat calls, all answered.
    assert len(trace.calls) == 4 and all(c.error is None for c in trace.calls)
    assert all(not c.tools for c in trace.calls)  # keystrokes in JSON text, no tool schemas


def test_the_reply_parser_follows_harbor() -> None:
    program = _program()
    ok = program.parse_reply(
        'Sure.\n{"analysis": "a", "plan": "p", "commands": '
        '[{"keystrokes": "ls\\n", "duration": 90}, {"keystrokes": "C-c"}], "task_complete": "yes"}'
    )
    assert ok["error"] == "" and ok["complete"] is True
    assert ok["commands"] == [("ls\n", 60.0), ("C-c", 1.0)]  # capped at 60 s; default 1 s
    assert ok["warnings"] == ["Extra text detected before JSON object"]
    assert program.parse_reply('{"analysis": "a"}')["error"] == (
        "Missing required fields: plan, commands"
    )
    fixed = program.parse_reply('{"analysis": "a", "plan": "p", "commands": []')
    assert fixed["error"] == "" and fixed["warnings"][0].startswith("AUTO-CORRECTED")
    assert program.parse_reply("no json")["error"] == "No valid JSON found in response"
    cut = program.limit_output("x" * 30000, 10000)
    assert cut.startswith("x" * 5000) and "20000 interior bytes omitted" in cut


def test_options_are_typed_and_refused_in_one_line() -> None:
    harness = make_harness("terminus-2", {"pane_width": 200, "max_steps": 5})
    assert isinstance(harness, Terminus2Harness) and isinstance(harness.config, Terminus2Config)
    assert not harness.SUPPORTS_RESUME and not harness.SUPPORTS_MCP
    with pytest.raises(vf.ConfigError, match=r"unknown option 'pane_widht'.*'pane_width'"):
        make_harness("terminus-2", {"pane_widht": 1})


@pytest.mark.bwrap
async def test_a_terminus_rollout_scores_in_bwrap() -> None:
    trace = await _rollout("bwrap")
    _check_solved(trace)
    first = trace.calls[0]
    assert first.dialect == "chat"
    # The pane's screen came back to the model: the cat's output is in the third request.
    replies = [json.loads(m.text) for m in trace.messages if m.role == "assistant"]
    assert [r["task_complete"] for r in replies] == [False, False, True, True]
    assert "hello terminus" in [m.text for m in trace.messages if m.role == "user"][2]
    # The programs run from the node's copy: the box holds only the program's transcript (its
    # task file, which held the secret, deleted once read; no program copies or bytecode), and
    # the .gitignore that keeps the folder out of a task's repo.
    assert WriteFile.left == [".vfray/.gitignore", ".vfray/terminus-transcript.json"]


@pytest.mark.slow
@pytest.mark.docker
async def test_a_terminus_rollout_scores_in_docker(docker_url: str, debian_in_docker: str) -> None:
    """On the Debian minbase image (python3 and git, no tmux, no libevent, nothing of the
    host's mounted): tmux runs from the node's tool dir, with its own libraries."""
    options = {"base_url": docker_url, "default_image": debian_in_docker}
    trace = await _rollout("docker", runtime_options=options)
    _check_solved(trace)


async def test_a_refused_call_ends_the_program_and_its_tmux_server() -> None:
    """max_turns=1: the second call is refused, the program stops cleanly and kills the tmux
    server it started (a daemon outside its process group), whose socket is gone from /tmp."""
    before = set(glob.glob("/tmp/vfray-tmux-*"))
    trace = await _rollout("subprocess", limits=Limits(max_turns=1), timeouts=Timeouts(agent=60))
    assert trace.stop_condition is vf.StopCondition.MAX_TURNS, (trace.stop_condition, trace.notes)
    assert trace.errors == [] and len(trace.calls) == 1
    assert set(glob.glob("/tmp/vfray-tmux-*")) == before


# -- skills, as Harbor's Terminus2 offers them -------------------------------------------------


SKILL_MD = (
    "---\nname: vowel-counter\ndescription: Counts the vowels of a word (a vfray test skill).\n"
    "---\n\nRun `scripts/count.sh WORD` and report its output.\n"
)


class UsesSkill(WriteFile):
    @vf.metric
    async def skill_readable(self, trace: vf.Trace, runtime: Runtime) -> bool:
        """The location the first prompt names is the skill's SKILL.md in the box, with its
        script executable: what the model needs to use it."""
        first = next(m.text for m in trace.messages if m.role == "user")
        location = first.split("<location>", 1)[1].split("</location>", 1)[0]
        shown = await runtime.run(["cat", location])
        counted = await runtime.run([location.replace("SKILL.md", "scripts/count.sh"), "banana"])
        return shown.stdout == SKILL_MD and counted.stdout.strip() == "3"


async def test_terminus_2_offers_its_skills_in_the_first_prompt_as_harbor_does(
    tmp_path: Path,
) -> None:
    skill = tmp_path / "vowel-counter"
    (skill / "scripts").mkdir(parents=True)
    (skill / "SKILL.md").write_text(SKILL_MD)
    (skill / "scripts" / "count.sh").write_text('#!/bin/sh\necho "$1" | tr -cd aeiou | wc -c\n')
    (skill / "scripts" / "count.sh").chmod(0o755)
    trace = await vf.run_rollout(
        UsesSkill(vf.TaskData(prompt=PROMPT, workdir="/box")),
        model="scripted:agent",
        harness="terminus-2",
        runtime="bwrap",
        harness_options={"skills": [str(skill)]},
    )
    _check_solved(trace)
    assert trace.metrics["skill_readable"] == 1.0
    first = next(m.text for m in trace.messages if m.role == "user")
    # Harbor's block, after the task and before the terminal state, the path absolute in the box.
    block = (
        f"{PROMPT}\n<available_skills>\n  <skill>\n    <name>vowel-counter</name>\n"
        "    <description>Counts the vowels of a word (a vfray test skill).</description>\n"
        "    <location>/box/.vfray/terminus-skills/vowel-counter/SKILL.md</location>\n"
        "  </skill>\n</available_skills>\n\nCurrent terminal state:"
    )
    assert block in first, first


@pytest.mark.parametrize(
    "front",
    [
        "name: plain\ndescription: A plain one.",
        "name: 'quoted'\ndescription: \"Has: a colon\"\nlicense: MIT",
        "name: folded\ndescription: >\n  First line\n  second line\nallowed-tools: Bash",
        "name: literal\ndescription: |\n  Line one\n  Line two",
        "# a comment\nname: commented\ndescription: After a comment.",
        "name: no-description",
        "description: No name.",
    ],
)
def test_skill_front_matter_reads_as_harbors_yaml_does(front: str) -> None:
    import yaml

    text = f"---\n{front}\n---\n\nBody.\n"
    theirs = yaml.safe_load(front)
    expected = (
        {"name": theirs["name"], "description": theirs["description"].strip()}
        if "name" in theirs and "description" in theirs
        else None
    )
    assert _program().skill_frontmatter(text) == expected
    assert _program().skill_frontmatter("no front matter\n") is None


def test_a_box_without_skills_gets_harbors_prompt_unchanged(tmp_path: Path) -> None:
    program = _program()
    assert program.skills_section(None) == ""
    assert program.skills_section(str(tmp_path / "absent")) == ""
    (tmp_path / "not-a-skill").mkdir()
    assert program.skills_section(str(tmp_path)) == ""
