"""The live ACP agents selected with ``runtime="modal"``, as far as the installed Modal SDK goes
offline: a whole two-segment rollout through vfray's modal runtime, where the agent's ACP stdio
is carried by the sandbox's ``exec`` process (``ModalProcess``), its files by the sandbox's
``filesystem``, and its box's image is the real ``modal.Image`` with the agent built in as
layers. The Modal service is the one part stood in for (tests/modal_box.py: each call bound to
the SDK's own signature, answered by local processes and files), so Modal's process model,
network and image builds are not shown here. Skipped with the reason when npm is offline.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from modal_box import LocalModal, image_layers
from test_acp import ACP_HARNESSES, WriteFiles, _commands, _install, _transcript

import vfray as vf
from vfray.harnesses import make_harness
from vfray.runtimes.modal import ModalRuntime
from vfray.runtimes.provision import image_build_commands, planned_tool

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("harness_id", ACP_HARNESSES)
async def test_two_acp_segments_over_a_modal_sandbox(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, harness_id: str
) -> None:
    pytest.importorskip("modal")
    # The node's install stands for the image layer: the same dir at the same path.
    _install(harness_id)
    local = LocalModal(tmp_path / "home")
    monkeypatch.setattr("vfray.runtimes.modal.optional_import", lambda *args: local)
    # The stand-in box runs on this host, so the interception's loopback URL is its public one
    # (a real box gets the node tunnel's URL: tests/test_runtime_modal.py).
    monkeypatch.setattr(ModalRuntime, "_public_url", lambda self, url: url)
    data = vf.TaskData(prompt='Write "one" to a.txt, then check it.', workdir=str(tmp_path / "w"))
    task = WriteFiles(data, {"a.txt": "one", "b.txt": "two"}, then='Now write "two" to b.txt.')
    trace = await vf.run_rollout(task, model="scripted:agent", harness=harness_id, runtime="modal")
    assert trace.errors == [], trace.errors
    assert trace.stop_condition is vf.StopCondition.COMPLETED
    assert trace.rewards["wrote_them"].value == 1.0
    assert _commands(trace) == [
        "printf '%s\\n' one > a.txt",
        "cat a.txt",
        "printf '%s\\n' two > b.txt",
        "cat b.txt",
    ]
    # One sandbox, created with the task's image plus the agent's layers, egress to the
    # interception's host alone.
    ((created, box),) = local.created
    spec = make_harness(harness_id).tool_spec()
    base, *layers = image_layers(created.arguments["image"])
    assert base == ["FROM python:3.11-slim"]
    assert layers == [["FROM base", *(f"RUN {c}" for c in image_build_commands(spec))]]
    assert created.arguments["outbound_cidr_allowlist"] == ["127.0.0.1/32"]
    # One agent process (no pid the host knows) and ACP session, two prompts over its stdio.
    events = _transcript(trace)
    kinds = [e["kind"] for e in events]
    assert kinds.count("process") == kinds.count("new_session") == 1
    assert kinds.count("prompt_response") == 2
    (process,) = [e for e in events if e["kind"] == "process"]
    assert process["pid"] is None
    assert process["argv"][0].startswith(f"{planned_tool(spec).path}/")  # where the layers put it
    # It was exec'd with stdio as bytes behind the pid-file wrapper that lets stop() signal it,
    # then stopped; the sandbox was terminated with nothing left running.
    agent_execs = [call for call in box.exec.calls if process["argv"][0] in call.arguments["args"]]
    assert len(agent_execs) == 1 and agent_execs[0].arguments["text"] is False
    assert [e for e in events if e["kind"] == "process_exit"]
    assert box.terminated and all(p.returncode is not None for p in box.processes)
