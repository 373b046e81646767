"""Trace recording: branches from concrete message sequences, dedup, stop conditions, round trip."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from vfray.trace import Message, RewardRecord, StopCondition, TaskRecord, Trace, Usage

SYS = Message(role="system", content="You are a coding agent.")
SUB_SYS = Message(role="system", content="You are a search sub-agent.")


def user(text: str) -> Message:
    return Message(role="user", content=text)


def bot(text: str) -> Message:
    return Message(role="assistant", content=text)


def new_trace() -> Trace:
    return Trace(task=TaskRecord(key="k", hash="h"))


def test_linear_growth_stays_one_branch() -> None:
    trace = new_trace()
    trace.record_call([SYS, user("fix the bug")], bot("ls"))
    trace.record_call([SYS, user("fix the bug"), bot("ls"), user("a.py b.py")], bot("cat a.py"))
    trace.record_call(
        [SYS, user("fix the bug"), bot("ls"), user("a.py b.py"), bot("cat a.py"), user("...")],
        bot("done"),
    )
    assert len(trace.branch_list) == 1
    assert [c.branch for c in trace.calls] == [0, 0, 0]
    assert [m.text for m in trace.branches[0]] == [
        "You are a coding agent.",
        "fix the bug",
        "ls",
        "a.py b.py",
        "cat a.py",
        "...",
        "done",
    ]
    assert trace.branch_list[0].call_indices == [0, 1, 2]
    # Seven distinct messages, stored once although requests repeated the history.
    assert len(trace.graph) == 7
    assert trace.messages == trace.branches[0]
    assert trace.last_reply == "done"
    assert trace.num_turns == 3


def test_compaction_starts_a_new_branch() -> None:
    trace = new_trace()
    trace.record_call([SYS, user("task")], bot("step 1"))
    trace.record_call([SYS, user("task"), bot("step 1"), user("out 1")], bot("step 2"))
    compacted = [SYS, user("Summary: did step 1 and 2."), user("continue")]
    trace.record_call(compacted, bot("step 3"))
    trace.record_call([*compacted, bot("step 3"), user("out 3")], bot("finished"))
    assert len(trace.branch_list) == 2
    assert [c.branch for c in trace.calls] == [0, 0, 1, 1]
    assert [m.text for m in trace.branches[1]][-1] == "finished"
    # The system prompt is shared by both branches but stored once.
    assert sum(1 for m in trace.graph.values() if m == SYS) == 1
    assert trace.branch_list[0].message_ids[0] == trace.branch_list[1].message_ids[0]
    assert trace.messages == trace.branches[1]


def test_edited_earlier_message_starts_a_new_branch() -> None:
    trace = new_trace()
    trace.record_call([SYS, user("what is 2+2?")], bot("5"))
    trace.record_call([SYS, user("what is 2+2?"), bot("5"), user("sure?")], bot("4"))
    # The harness rewrote the earlier assistant turn before asking again.
    trace.record_call([SYS, user("what is 2+2?"), bot("4"), user("sure?")], bot("yes, 4"))
    assert len(trace.branch_list) == 2
    assert [c.branch for c in trace.calls] == [0, 0, 1]
    assert len(trace.branches[0]) == 5
    assert len(trace.branches[1]) == 5


def test_sub_agent_with_own_system_prompt_interleaves_with_main_branch() -> None:
    trace = new_trace()
    main = [SYS, user("refactor the repo")]
    trace.record_call(main, bot("spawn search"))
    trace.record_call([SUB_SYS, user("find usages of foo")], bot("grep foo"))
    trace.record_call(
        [SUB_SYS, user("find usages of foo"), bot("grep foo"), user("a.py:3")], bot("in a.py")
    )
    trace.record_call([*main, bot("spawn search"), user("sub-agent: in a.py")], bot("edit a.py"))
    assert [c.branch for c in trace.calls] == [0, 1, 1, 0]
    assert len(trace.branch_list) == 2
    assert trace.branches[0][0] == SYS
    assert trace.branches[1][0] == SUB_SYS
    assert trace.last_reply == "edit a.py"


def test_each_distinct_message_is_stored_once() -> None:
    trace = new_trace()
    history: list[Message] = [SYS]
    for i in range(10):
        history.append(user(f"q{i}"))
        reply = bot(f"a{i}")
        trace.record_call(list(history), reply)
        history.append(reply)
    assert len(trace.graph) == 21
    assert len(trace.branch_list) == 1
    total_refs = sum(len(c.request_ids) for c in trace.calls)
    assert total_refs > len(trace.graph)  # requests reference the shared messages by id


def test_failed_call_then_retry_continues_the_branch() -> None:
    trace = new_trace()
    request = [SYS, user("hello")]
    trace.record_call(request, None, error=None)
    trace.record_call(request, bot("hi"))
    assert len(trace.branch_list) == 1
    assert trace.num_turns == 1
    assert len(trace.calls) == 2
    assert trace.branches[0][-1] == bot("hi")


def test_resampling_the_same_request_forks_a_branch() -> None:
    trace = new_trace()
    request = [SYS, user("tell a joke")]
    trace.record_call(request, bot("joke one"))
    trace.record_call(request, bot("joke two"))
    assert [c.branch for c in trace.calls] == [0, 1]
    assert [b[-1].text for b in trace.branches] == ["joke one", "joke two"]


def test_stop_condition_terminated_vs_truncated() -> None:
    assert StopCondition.COMPLETED.terminated and not StopCondition.COMPLETED.truncated
    assert StopCondition.STOP_HOOK.terminated
    assert StopCondition.USER_CLOSED.terminated
    for cond in (StopCondition.MAX_TURNS, StopCondition.MAX_TOTAL_TOKENS, StopCondition.TIMEOUT):
        assert cond.truncated and not cond.terminated
    for cond in (StopCondition.ERROR, StopCondition.CANCELLED):
        assert not cond.terminated and not cond.truncated
    for cond in StopCondition:
        assert not (cond.terminated and cond.truncated)


def test_first_stop_condition_wins() -> None:
    trace = new_trace()
    assert trace.stop(StopCondition.MAX_TURNS)
    assert not trace.stop(StopCondition.ERROR)
    assert trace.stop_condition is StopCondition.MAX_TURNS


def test_reward_is_weighted_sum_of_scored_rewards() -> None:
    trace = new_trace()
    assert trace.reward is None
    trace.rewards["a"] = RewardRecord(value=1.0, weight=0.5)
    trace.rewards["b"] = RewardRecord(value=2.0, weight=2.0)
    trace.rewards["c"] = RewardRecord(value=None, weight=3.0, error="boom")
    assert trace.reward == 4.5


def test_trace_round_trips_through_json() -> None:
    trace = new_trace()
    trace.record_call([SYS, user("q")], bot("a"), model="m", usage=Usage(input_tokens=3))
    trace.rewards["ok"] = RewardRecord(value=1.0)
    trace.stop(StopCondition.COMPLETED)
    trace.add_error(RuntimeError("late"), phase="finalize")
    again = Trace.model_validate_json(trace.model_dump_json())
    assert again == trace
    assert again.usage.input_tokens == 3
    assert again.branches == trace.branches
    assert not again.ok


# -- record_call stores only the new tail: the same trace as storing every message --------------

# Two objects with one content id (a None extra field is not hashed) but different dumps: which
# one the graph keeps shows whether messages were offered to it in the same order.
_SAME_ID = Message(role="user", content="q", note=None)
POOL = [SYS, SUB_SYS, user("q"), _SAME_ID, bot("a"), bot("b"), user("r")]
steps = st.lists(
    st.tuples(
        st.booleans(),  # continue from the last request and its reply, or start afresh
        st.integers(0, 8),  # keep this much of it (a rewrite or compaction when short)
        st.lists(st.integers(0, len(POOL) - 1), max_size=3),  # then append these
        st.none() | st.integers(0, len(POOL) - 1),  # the reply, None for a failed call
    ),
    max_size=12,
)


def _record_call_offering_everything(
    trace: Trace, request: list[Message], response: Message | None
) -> None:
    """The reference: every request message, then the reply, offered to the graph in order
    (what record_call did before it skipped the prefix the branch already holds)."""
    for message in request:
        trace.add_message(message)
    if response is not None:
        trace.add_message(response)
    trace.record_call(request, response)


@settings(max_examples=300, deadline=None)
@given(steps=steps)
def test_record_call_stores_the_same_graph_as_offering_every_message(
    steps: list[tuple[bool, int, list[int], int | None]],
) -> None:
    trace, reference = new_trace(), new_trace()
    last: list[Message] = []
    for extend, keep, added, reply in steps:
        request = (last[:keep] if extend else []) + [POOL[i] for i in added]
        response = None if reply is None else POOL[reply]
        trace.record_call(request, response)
        _record_call_offering_everything(reference, request, response)
        last = request + ([response] if response is not None else [])
    assert list(trace.graph.items()) == list(reference.graph.items())
    assert [m.model_dump() for m in trace.graph.values()] == [
        m.model_dump() for m in reference.graph.values()
    ]
    assert trace.branch_list == reference.branch_list
    assert trace.calls == reference.calls
