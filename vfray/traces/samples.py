"""The ``samples`` training view: one row per branch, with its token ids, mask and logprobs.

A branch is one linear context, so its calls' token ids line up into one sequence: the first
call's prompt, then for every turn the tokens the environment inserted (mask 0) followed by
the tokens the model sampled (mask 1). A branch whose ids do not line up exactly is never
repaired: its token columns are null and ``token_error`` says why.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from vfray.episode import seat_role
from vfray.trace import Branch, ModelCall, Trace
from vfray.traces.columns import MessagesColumn
from vfray.traces.convert import table_to_traces
from vfray.traces.schema import SAMPLE_SCHEMA, TRACE_SCHEMA_VERSION


@dataclass
class BranchTokens:
    """One branch's tokens: the opening prompt, then everything after it with a loss mask."""

    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    completion_mask: list[int]
    completion_logprobs: list[float] | None
    turn_ends: list[tuple[int, int]] = field(default_factory=list)
    """Per answered call with a non-empty completion: (call index, position of its last
    sampled token in ``completion_token_ids``)."""


MISSING = "missing"
"""``token_error``: a call of the branch came back without prompt or completion token ids."""
PREFIX_BREAK = "prefix_break"
"""``token_error``: a later prompt does not start with the earlier prompt + completion (the
history was re-tokenised differently, or edited): the sample cannot be trained on exactly."""


def check_branch_tokens(calls: Sequence[ModelCall]) -> BranchTokens | str | None:
    """Line up the token ids of a branch's calls; the reason (:data:`MISSING`,
    :data:`PREFIX_BREAK`) when they cannot be, None when no call was answered.

    A branch is refused when a call lacks token ids, or when a later prompt does not start
    with the earlier prompt + completion (the tokenizer re-encoded the history differently):
    it cannot be trained on token-exactly, and guessing would corrupt the sample.
    Logprobs are None when any call lacks them; inserted tokens get logprob 0.0 (masked).
    """
    answered = [c for c in calls if c.response_id is not None]
    if not answered:
        return None
    first = answered[0]
    if first.prompt_token_ids is None or first.completion_token_ids is None:
        return MISSING
    prompt = list(first.prompt_token_ids)
    completion = list(first.completion_token_ids)
    mask = [1] * len(completion)
    logprobs: list[float] | None = (
        list(first.completion_logprobs) if first.completion_logprobs is not None else None
    )
    context = prompt + completion
    ends = [(first.index, len(completion) - 1)] if completion else []
    for call in answered[1:]:
        if call.prompt_token_ids is None or call.completion_token_ids is None:
            return MISSING
        if call.prompt_token_ids[: len(context)] != context:
            return PREFIX_BREAK
        inserted = call.prompt_token_ids[len(context) :]
        completion += inserted
        completion += call.completion_token_ids
        mask += [0] * len(inserted)
        mask += [1] * len(call.completion_token_ids)
        if call.completion_token_ids:
            ends.append((call.index, len(completion) - 1))
        if logprobs is not None and call.completion_logprobs is not None:
            logprobs += [0.0] * len(inserted)
            logprobs += call.completion_logprobs
        else:
            logprobs = None
        context = list(call.prompt_token_ids) + list(call.completion_token_ids)
    return BranchTokens(prompt, completion, mask, logprobs, ends)


def completion_rewards(tokens: BranchTokens, turn_rewards: dict[int, float]) -> list[float] | None:
    """Per completion token: the turn reward of the call whose last sampled token it is, 0.0
    elsewhere (SkyRL's per-token rewards; verl's ``token_level_rewards``); None when no turn
    of the branch got one."""
    if not turn_rewards or not any(i in turn_rewards for i, _ in tokens.turn_ends):
        return None
    out = [0.0] * len(tokens.completion_token_ids)
    for index, position in tokens.turn_ends:
        out[position] = turn_rewards.get(index, 0.0)
    return out


def _sample_row(trace: Trace, branch: Branch) -> dict[str, Any]:
    calls = [trace.calls[i] for i in branch.call_indices if i < len(trace.calls)]
    checked = check_branch_tokens(calls)
    tokens = checked if isinstance(checked, BranchTokens) else None
    versions = [c.policy_version for c in calls if c.policy_version is not None]
    answered = [c for c in calls if c.response_id is not None]
    stop = trace.stop_condition
    return {
        "schema_version": TRACE_SCHEMA_VERSION,
        "run_id": trace.run_id,
        "trace_id": trace.trace_id,
        "episode_id": trace.episode_id,
        "task_key": trace.task.key,
        "rollout_index": trace.rollout_index,
        "attempt": trace.attempt,
        "branch": branch.id,
        "num_branches": len(trace.branch_list),
        "prompt_token_ids": None if tokens is None else tokens.prompt_token_ids,
        "completion_token_ids": None if tokens is None else tokens.completion_token_ids,
        "completion_mask": None if tokens is None else tokens.completion_mask,
        "completion_logprobs": None if tokens is None else tokens.completion_logprobs,
        "reward": trace.reward,
        "advantage": trace.advantage,
        "ok": trace.ok,
        "stop_condition": None if stop is None else stop.value,
        "model": trace.agent.model,
        "policy_version": min(versions) if versions else None,
        "seat": trace.seat,
        "agent_name": trace.agent.name,
        "token_error": checked if isinstance(checked, str) else None,
        "finish_reason": answered[-1].finish_reason if answered else None,
        "truncated": any(c.finish_reason == "length" for c in answered) if answered else None,
        "completion_rewards": None
        if tokens is None
        else completion_rewards(tokens, trace.turn_rewards),
    }


def _turn_rows(trace: Trace, branch: Branch) -> list[tuple[dict[str, Any], list[str]]]:
    """A broken branch as one sample per answered call (SkyRL's step-wise samples): each
    call's own prompt and completion, all of it sampled (mask 1), with the call's messages."""
    out = []
    for index in branch.call_indices:
        call = trace.calls[index] if index < len(trace.calls) else None
        if call is None or call.response_id is None:
            continue
        row = _sample_row(trace, Branch(id=branch.id, call_indices=[index]))
        row["turn"] = index
        out.append((row, [*call.request_ids, call.response_id]))
    return out


ON_PREFIX_BREAK = ("drop", "per_turn")
"""What :func:`to_samples` does with a branch whose ids do not line up (:data:`PREFIX_BREAK`)."""


def to_samples(
    data: pa.Table | Iterable[Trace],
    *,
    seat: str | None = None,
    on_prefix_break: str = "drop",
) -> pa.Table:
    """The training view of traces (or of a trace table): one row per branch.

    Every branch of a trace shares the trace's reward and advantage: a compaction or a
    sub-agent is part of the same attempt and is credited with its outcome. In a multi-agent
    episode each seat's trace gives its own samples (``seat`` column, with that seat's reward
    and advantage); ``seat=`` keeps only that seat's (one policy's) samples: ``"solver"`` all
    of its runs (``solver``, ``solver#2``, ...), ``"solver#2"`` that run only.

    A branch whose later prompt does not extend its earlier prompt + completion (a chat template
    that re-renders history; token-in/token-out, ``interception.token_in``, prevents it) is kept
    as one row with null token columns and ``token_error = "prefix_break"`` (``"drop"``: the
    batch builders leave it out), or, with ``on_prefix_break="per_turn"``, as one row per
    answered call: each turn's exact prompt and completion, ``turn`` = the call's index. Those
    rows are what the model saw at each turn; none is repaired.
    """
    if on_prefix_break not in ON_PREFIX_BREAK:
        raise ValueError(
            f"on_prefix_break must be one of {', '.join(ON_PREFIX_BREAK)}, got {on_prefix_break!r}"
        )
    traces = table_to_traces(data) if isinstance(data, pa.Table) else data
    rows: list[dict[str, Any]] = []
    messages = MessagesColumn()
    for trace in traces:
        if seat is not None and seat not in (trace.seat, seat_role(trace.seat)):
            continue
        for branch in trace.branch_list:
            row = _sample_row(trace, branch)
            if row["token_error"] == PREFIX_BREAK and on_prefix_break == "per_turn":
                for turn_row, message_ids in _turn_rows(trace, branch):
                    rows.append(turn_row)
                    messages.append(trace, message_ids)
                continue
            rows.append(row)
            messages.append(trace, branch.message_ids)
    columns = [
        messages.finish()
        if column.name == "messages"
        else pa.array([row.get(column.name) for row in rows], type=column.type)
        for column in SAMPLE_SCHEMA
    ]
    return pa.Table.from_arrays(columns, schema=SAMPLE_SCHEMA)
