"""Reading v1's ``traces.jsonl`` back rollout by rollout (:func:`read_v1_traces`): files written
by verifiers 0.4.0 itself (tests/fixtures/v1_traces: the v1tools package on the bash harness and
the v1user package under ``--env.id user-sim``, both on the scripted model) give each rollout's
task, seat, scores, stop and transcript; and a vfray trace exported then read back gives the
transcript it recorded."""

from __future__ import annotations

import json
from pathlib import Path

import vfray as vf
from vfray.compat.v1 import loader
from vfray.compat.v1.traces import Outcome, plain_message, read_v1_traces, to_v1_episodes

FIXTURES = Path(__file__).parent / "fixtures" / "v1_traces"
V1CMP = str(Path(__file__).parent / "v1_tasksets" / "v1cmp")


def test_a_verifiers_toolset_run_reads_back_with_its_tool_calls() -> None:
    outcomes = sorted(read_v1_traces(FIXTURES / "v1tools_bash.jsonl"), key=lambda o: o.idx or 0)
    assert [(o.idx, o.agent, o.stop_condition, o.errors) for o in outcomes] == [
        (0, "agent", "agent_completed", ()),
        (1, "agent", "agent_completed", ()),
    ]
    first = outcomes[0]
    assert first.key.startswith("8b2902e20a8c") and first.reply == "Done. 42"
    assert (first.rewards, first.metrics, first.reward) == ({"doubled": 1.0}, {"turns": 2.0}, 1.0)
    # The transcript: bash's system prompt and the task's prompt, then what the rollout added,
    # call ids dropped and tool arguments parsed.
    assert [m["role"] for m in first.messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    assert first.completion == (
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"name": "doubler_double", "arguments": {"x": 21}}],
        },
        {"role": "tool", "content": "42"},
        {"role": "assistant", "content": "Done. 42"},
    )


def test_a_verifiers_user_sim_run_reads_back_seat_by_seat() -> None:
    outcomes = read_v1_traces(FIXTURES / "v1user_user_sim.jsonl")
    seats = {(o.idx, o.agent): o for o in outcomes}
    assert sorted(seats) == [(0, "assistant"), (0, "user"), (1, "assistant"), (1, "user")]
    assistant, user = seats[(0, "assistant")], seats[(0, "user")]
    assert [m["content"] for m in assistant.messages] == [
        "What is 2 + 3?",
        "5",
        "What is 4 + 4?",
        "8",
    ]
    assert assistant.completion == assistant.messages[1:]  # its prompt nulled: the user opens
    assert (assistant.rewards, assistant.metrics) == (
        {"correct": 1.0},
        {"replies": 2.0, "user_turns": 3.0},
    )
    assert (
        user.messages[0]["role"] == "system" and "> What is 2 + 3?" in user.messages[0]["content"]
    )
    assert user.reply == "###DONE###" and (user.rewards, user.metrics) == ({}, {})
    assert {o.stop_condition for o in outcomes} == {"user_closed"}


async def test_a_vfray_trace_exported_reads_back_with_its_transcript(tmp_path: Path) -> None:
    task = next(iter(loader.load(V1CMP, {"kinds": ["runtime"]}).load()))
    trace = await vf.run_rollout(task, model="scripted:arithmetic", harness="null")
    path = tmp_path / "traces.jsonl"
    path.write_text("".join(json.dumps(e, default=str) + "\n" for e in to_v1_episodes([trace])))
    [outcome] = read_v1_traces(path)
    assert isinstance(outcome, Outcome) and outcome.key == trace.task.key
    assert [(m["role"], m["content"]) for m in outcome.messages] == [
        (m.role, m.text) for m in trace.messages
    ]
    assert outcome.completion == ({"role": "assistant", "content": "5"},)
    assert outcome.rewards == {k: r.value for k, r in trace.rewards.items()}
    assert outcome.metrics == dict(trace.metrics) and outcome.idx == 0


def test_plain_message_drops_ids_and_parses_arguments() -> None:
    message = {
        "role": "assistant",
        "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b "}],
        "tool_calls": [{"id": "c1", "name": "t", "arguments": '{"k": [1]}'}],
    }
    assert plain_message(message) == {
        "role": "assistant",
        "content": "ab",
        "tool_calls": [{"name": "t", "arguments": {"k": [1]}}],
    }
