"""The ``compact`` and ``rlm`` harnesses (issue 30): real rollouts of the chat loop through the
interception, driven by the scripted ``agent`` model, in a subprocess, bwrap and docker. A
compaction and a sub-call each start a context of their own, recorded as a branch of its own,
and each branch is its own training sample; a refused call stops the program at any depth."""

from __future__ import annotations

import shutil
from typing import Any

import pytest

import vfray as vf
from vfray.interception import Limits
from vfray.runtimes.base import Runtime
from vfray.trace import Trace
from vfray.traces.samples import to_samples

COMPACT_PROMPT = 'write "hello agent" to out.txt'
RLM_PROMPT = 'ask: write "hello agent" to out.txt\nrun: cat out.txt'


class WriteFile(vf.Task[vf.TaskData]):
    @vf.reward
    async def wrote_it(self, runtime: Runtime) -> bool:
        return (await runtime.read("out.txt")) == b"hello agent\n"


async def _rollout(harness: str, prompt: str, options: dict[str, Any], **kw: Any) -> Trace:
    workdir = "/box" if kw.get("runtime") == "bwrap" else None
    return await vf.run_rollout(
        WriteFile(vf.TaskData(prompt=prompt, workdir=workdir)),
        model="scripted:agent",
        harness=harness,
        harness_options=options,
        **kw,
    )


def _texts(trace: Trace, branch: int) -> list[tuple[str, str]]:
    ids = trace.branch_list[branch].message_ids
    return [(trace.graph[i].role, str(trace.graph[i].content or "")) for i in ids]


def _check_compacted(trace: Trace) -> None:
    assert trace.errors == [], trace.errors
    assert trace.stop_condition is vf.StopCondition.COMPLETED
    assert trace.rewards["wrote_it"].value == 1.0
    # Compaction after each of the two tool steps: three contexts, three branches; each of the
    # first two ends with the summary request and its answer, the next opens with the summary.
    assert len(trace.branch_list) == 3 and len(trace.calls) == 5
    for branch in (0, 1):
        request, summary = _texts(trace, branch)[-2:]
        assert request[1].startswith("Summarise the conversation so far")
        assert summary[1].endswith(f"[steps done: {branch + 1}]")
        opening = _texts(trace, branch + 1)[:2]
        assert opening[0] == ("user", COMPACT_PROMPT)
        assert opening[1][1].endswith(summary[1])
    assert _texts(trace, 2)[-1] == ("assistant", "Done.")


def _check_recursed(trace: Trace) -> None:
    assert trace.errors == [], trace.errors
    assert trace.stop_condition is vf.StopCondition.COMPLETED
    assert trace.rewards["wrote_it"].value == 1.0
    root, sub = _texts(trace, 0), _texts(trace, 1)
    assert root[0] == ("user", RLM_PROMPT)
    # The sub-call's context is its question alone; its answer is the root's tool result.
    assert sub[0] == ("user", 'write "hello agent" to out.txt')
    assert root[2] == ("tool", sub[-1][1]) and sub[-1][1] == "Done. hello agent"
    assert trace.branch_list[1].call_indices == [1, 2, 3]
    assert trace.branch_list[0].call_indices == [0, 4, 5]


async def test_compact_opens_a_branch_per_compaction_and_each_is_a_sample() -> None:
    trace = await _rollout("compact", COMPACT_PROMPT, {"compact_at": 1})
    _check_compacted(trace)
    samples = to_samples([trace])
    assert samples.column("branch").to_pylist() == [0, 1, 2]
    assert samples.column("num_branches").to_pylist() == [3, 3, 3]
    assert samples.column("reward").to_pylist() == [1.0, 1.0, 1.0]
    lengths = [len(m) for m in samples.column("messages").to_pylist()]
    assert lengths == [len(b.message_ids) for b in trace.branch_list]
    # Far from the threshold, no compaction: one branch, as the bash harness.
    plain = await _rollout("compact", COMPACT_PROMPT, {})
    assert plain.rewards["wrote_it"].value == 1.0 and len(plain.branch_list) == 1


async def test_rlm_records_each_sub_call_as_a_branch_and_sample() -> None:
    trace = await _rollout("rlm", RLM_PROMPT, {})
    _check_recursed(trace)
    assert to_samples([trace]).column("branch").to_pylist() == [0, 1]
    # The sub-call is not offered `ask` at the deepest level.
    assert "ask" in {t["function"]["name"] for t in trace.calls[0].tools or []}
    assert "ask" not in {t["function"]["name"] for t in trace.calls[1].tools or []}


@pytest.mark.parametrize(
    ("harness", "prompt", "options"),
    [("compact", COMPACT_PROMPT, {"compact_at": 1}), ("rlm", RLM_PROMPT, {})],
)
async def test_a_refused_call_stops_the_program_at_any_depth(
    harness: str, prompt: str, options: dict[str, Any]
) -> None:
    # compact: the refused call opens the second context; rlm: it is the sub-call's second.
    trace = await _rollout(harness, prompt, options, limits=Limits(max_turns=2))
    assert trace.errors == [], trace.errors
    assert trace.stop_condition is vf.StopCondition.MAX_TURNS
    # The refused call is not recorded; the program ends cleanly on it.
    assert len(trace.calls) == 2 and all(c.response_id is not None for c in trace.calls)
    # compact: the summary was answered, the compacted context's first call refused; rlm: the
    # sub-call's first step answered (its own branch), its second refused.
    assert len(trace.branch_list) == (1 if harness == "compact" else 2)


@pytest.mark.bwrap
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="no bwrap")
async def test_compact_and_rlm_in_bwrap() -> None:
    _check_compacted(await _rollout("compact", COMPACT_PROMPT, {"compact_at": 1}, runtime="bwrap"))
    _check_recursed(await _rollout("rlm", RLM_PROMPT, {}, runtime="bwrap"))


@pytest.mark.docker
async def test_compact_and_rlm_in_docker(docker_url: str) -> None:
    from docker_engine import runtime_options

    options = {"runtime": "docker", "runtime_options": runtime_options(docker_url)}
    _check_compacted(await _rollout("compact", COMPACT_PROMPT, {"compact_at": 1}, **options))
    _check_recursed(await _rollout("rlm", RLM_PROMPT, {}, **options))
