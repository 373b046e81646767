"""Codex's bundled system skills are unpacked once per node, not into every rollout's home: the
codex and codex-acp harnesses link ``$CODEX_HOME/skills/.system`` to a read-only copy beside the
tool dir that Codex itself made, Codex keeps it (its marker matches), and the model is still
shown the same skills. Real agents (npm) and real bwrap boxes."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
from agent_tools import need_registry

import vfray as vf
from vfray.harnesses import make_harness
from vfray.harnesses._codex_skills import MARKER, _run_until, seed_path, seeded_system_skills
from vfray.harnesses.codex import CODEX_HOME
from vfray.harnesses.provisioned import ProvisionedHarness
from vfray.runtimes.base import Runtime
from vfray.runtimes.provision import InstalledTool, ensure_tool

HOME_SKILLS = f"{CODEX_HOME}/skills"


def _tool(harness_id: str) -> InstalledTool:
    harness = make_harness(harness_id)
    assert isinstance(harness, ProvisionedHarness)
    return ensure_tool(harness.tool_spec(), harness.tools_root)


class WriteAndLook(vf.Task[vf.TaskData]):
    """Solved when out.txt holds the line; records where the home's system skills point and
    what else the agent left in the home's skills folder."""

    seen: dict[str, str] = {}

    @vf.reward
    async def wrote_it(self, runtime: Runtime) -> bool:
        return (await runtime.read("out.txt")) == b"hello agent\n"

    @vf.metric
    async def looked(self, runtime: Runtime) -> float:
        link = await runtime.run(["readlink", f"{HOME_SKILLS}/.system"])
        inside = await runtime.run(["find", HOME_SKILLS, "-mindepth", "1"])
        self.seen.update(link=link.stdout.strip(), inside=inside.stdout.strip())
        return 1.0


def test_the_unpacking_run_leaves_no_process_behind(tmp_path: Path) -> None:
    """npm's codex-acp is a node script running the native binary as its child: the seeding run
    is ended with every process it started, not only the one vfray spawned."""
    marker, pid_file = tmp_path / "skills" / MARKER, tmp_path / "child.pid"
    script = f"sleep 300 & echo $! > {pid_file}; mkdir -p {marker.parent}; touch {marker}; wait"
    assert _run_until(["/bin/sh", "-c", script], {"PATH": "/usr/bin:/bin"}, marker)
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        with open(f"/proc/{child}/stat") as fh:  # killed, not yet reaped by init
            if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                break
        time.sleep(0.05)
    else:
        os.kill(child, 9)
        raise AssertionError("the unpacking run's child outlived it")


def test_the_nodes_copy_is_made_once_read_only_and_none_when_codex_makes_none(
    tmp_path: Path,
) -> None:
    need_registry("npm")
    real = _tool("codex")
    # The tool as if installed under tmp_path (its programs are the real install's).
    tool = real.model_copy(update={"path": tmp_path / real.path.name})
    codex = real.executable("codex")
    seed = seeded_system_skills(tool, [codex, "debug", "prompt-input", "."])
    assert seed == seed_path(tool) and (seed / MARKER).is_file()
    assert {p.name for p in seed.iterdir()} >= {MARKER, "skill-creator", "imagegen"}
    assert not any(p.stat().st_mode & 0o222 for p in [seed, *seed.rglob("*")])
    # Made once: later calls find it without running anything.
    assert seeded_system_skills(tool, ["/bin/false"]) == seed
    # A command that unpacks nothing gives no copy and leaves nothing behind.
    other = real.model_copy(update={"path": tmp_path / "other" / real.path.name})
    (tmp_path / "other").mkdir()
    assert seeded_system_skills(other, ["/bin/true"]) is None
    assert [p.name for p in (tmp_path / "other").iterdir()] == [".locks"]


@pytest.mark.bwrap
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="no bwrap")
@pytest.mark.parametrize("harness_id", ["codex", "codex-acp"])
async def test_each_rollouts_home_links_the_nodes_skills_and_the_model_still_sees_them(
    harness_id: str,
) -> None:
    need_registry("npm")
    seed = seed_path(_tool(harness_id))
    # Not bwrap's default /work: a host venv under /work (this machine's) would be hidden.
    data = vf.TaskData(prompt='Write "hello agent" to out.txt, then check it.', workdir="/box")
    task = WriteAndLook(data)
    task.seen = {}
    trace = await vf.run_rollout(
        task,
        model="scripted:agent",
        harness=harness_id,
        runtime="bwrap",
    )
    assert trace.errors == [] and trace.reward == 1.0, trace.errors
    # The home holds the link and nothing Codex unpacked; the copy is whole.
    assert task.seen == {"link": str(seed), "inside": f"{HOME_SKILLS}/.system"}
    assert (seed / MARKER).is_file()
    # The model is shown the system skills, from the node's copy.
    first = " ".join(trace.graph[i].text for i in trace.calls[0].request_ids)
    assert "skill-creator" in first and str(seed) in first, first[:2000]
