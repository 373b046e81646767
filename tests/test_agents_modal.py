"""The one-shot agent harnesses selected with ``runtime="modal"``, offline: a scored ``codex``
and ``claude-code`` rollout through vfray's modal runtime, the program run by the sandbox's
``exec`` from where the box's image layers install it, its transcript read back through the
sandbox's ``filesystem``. (mini-swe-agent's run is the same path; its image layers, a venv of
the image's Python, are checked in tests/test_runtime_modal.py.) The Modal service is stood in for
(tests/modal_box.py: each call bound to the SDK's own signature, answered by local processes and
files), so Modal's process model, network and image builds are not shown here. Skipped with the
reason when a registry is offline.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from agent_tools import need_registry
from modal_box import LocalModal, image_layers

import vfray as vf
from vfray.harnesses import make_harness
from vfray.harnesses.provisioned import ProvisionedHarness
from vfray.runtimes.base import Runtime
from vfray.runtimes.modal import ModalRuntime
from vfray.runtimes.provision import ensure_tool, image_build_commands, planned_tool


class WriteFile(vf.Task[vf.TaskData]):
    @vf.reward
    async def wrote_it(self, runtime: Runtime) -> bool:
        return (await runtime.read("out.txt")) == b"hello agent\n"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("harness_id", "registry", "transcript"),
    [
        ("codex", "npm", "codex-events.jsonl"),
        ("claude-code", "npm", "claude-events.jsonl"),
    ],
)
async def test_agent_rollout_over_a_modal_sandbox(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, harness_id: str, registry: str, transcript: str
) -> None:
    pytest.importorskip("modal")
    need_registry(registry)
    harness = make_harness(harness_id)
    assert isinstance(harness, ProvisionedHarness)
    # The node's install stands for the image layer: the same dir at the same path.
    ensure_tool(harness.tool_spec(), harness.tools_root)
    local = LocalModal(tmp_path / "home")
    monkeypatch.setattr("vfray.runtimes.modal.optional_import", lambda *args: local)
    # The stand-in box runs on this host: the interception's loopback URL is its public one.
    monkeypatch.setattr(ModalRuntime, "_public_url", lambda self, url: url)
    data = vf.TaskData(
        prompt='Write "hello agent" to out.txt, then check it.', workdir=str(tmp_path / "w")
    )
    trace = await vf.run_rollout(
        WriteFile(data), model="scripted:agent", harness=harness_id, runtime="modal"
    )
    assert trace.errors == [], trace.errors
    assert trace.stop_condition is vf.StopCondition.COMPLETED
    assert trace.rewards["wrote_it"].value == 1.0
    assert len(trace.calls) == 3 and all(c.error is None for c in trace.calls)
    (artifact,) = trace.artifacts
    assert artifact.name == transcript and artifact.content
    ((created, box),) = local.created
    spec = harness.tool_spec()
    _, *layers = image_layers(created.arguments["image"])
    assert layers == [["FROM base", *(f"RUN {c}" for c in image_build_commands(spec))]]
    # The program was exec'd from the layers' path.
    tool = str(planned_tool(spec).path)
    assert any(tool in " ".join(call.arguments["args"]) for call in box.exec.calls)
    assert box.terminated
