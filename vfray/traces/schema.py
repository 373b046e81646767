"""The versioned Arrow schemas of vfray's trace tables: one row per rollout attempt, and the
per-branch ``samples`` training view.

Maps are stored as ``list<struct<key, value>>`` (the physical layout of an Arrow map) because
HF ``datasets`` cannot read the Arrow ``map`` type; everything else is plain Arrow that pandas,
``datasets`` and Ray Data read unchanged.
"""

from __future__ import annotations

import pyarrow as pa

TRACE_SCHEMA_VERSION = 1
"""Bump when a column changes meaning or type; adding a nullable column does not need a bump."""

SCHEMA_VERSION_KEY = b"vfray.schema_version"
KIND_KEY = b"vfray.kind"

MESSAGE_TYPE = pa.struct(
    [
        pa.field("id", pa.string()),
        pa.field("role", pa.string()),
        pa.field("content", pa.string()),
        pa.field("name", pa.string()),
        pa.field("tool_call_id", pa.string()),
        pa.field("tool_calls_json", pa.string()),
        pa.field("reasoning_content", pa.string()),
        # The whole message as JSON when ``content`` above is a lossy flattening (structured
        # content parts) or the provider added fields; null when the columns say it all.
        pa.field("raw_json", pa.string()),
    ]
)
"""One chat message: ``content`` is always text (structured content flattened)."""

MESSAGES_TYPE = pa.list_(MESSAGE_TYPE)

SCORES_TYPE = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.float64())]))
"""name → score, as an ordered list of ``{key, value}`` pairs (value null when unscored)."""

TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")

PHASES = ("boot", "setup", "agent", "finalize", "scoring", "teardown")
"""Rollout phases that get their own ``<phase>_s`` duration column."""


def _metadata(kind: str) -> dict[bytes, bytes]:
    return {SCHEMA_VERSION_KEY: str(TRACE_SCHEMA_VERSION).encode(), KIND_KEY: kind.encode()}


TRACE_SCHEMA = pa.schema(
    [
        pa.field("schema_version", pa.int16(), nullable=False),
        pa.field("run_id", pa.string()),
        pa.field("trace_id", pa.string(), nullable=False),
        pa.field("episode_id", pa.string()),
        pa.field("task_key", pa.string(), nullable=False),
        pa.field("task_hash", pa.string(), nullable=False),
        pa.field("task_type", pa.string()),
        pa.field("rollout_index", pa.int64(), nullable=False),
        pa.field("attempt", pa.int64(), nullable=False),
        pa.field("task", pa.string()),
        pa.field("messages", MESSAGES_TYPE),
        pa.field("reward", pa.float64()),
        pa.field("rewards", SCORES_TYPE),
        pa.field("metrics", SCORES_TYPE),
        pa.field("advantage", pa.float64()),
        pa.field("ok", pa.bool_(), nullable=False),
        pa.field("stop_condition", pa.string()),
        pa.field("terminated", pa.bool_()),
        pa.field("truncated", pa.bool_()),
        pa.field("error_type", pa.string()),
        pa.field("error_message", pa.string()),
        pa.field("error_phase", pa.string()),
        pa.field("num_errors", pa.int64()),
        pa.field("num_turns", pa.int64()),
        pa.field("num_calls", pa.int64()),
        pa.field("num_branches", pa.int64()),
        pa.field("input_tokens", pa.int64()),
        pa.field("output_tokens", pa.int64()),
        pa.field("model", pa.string()),
        pa.field("harness", pa.string()),
        pa.field("runtime", pa.string()),
        pa.field("created_at", TIMESTAMP_TYPE),
        pa.field("started_at", TIMESTAMP_TYPE),
        pa.field("ended_at", TIMESTAMP_TYPE),
        pa.field("duration_s", pa.float64()),
        *(pa.field(f"{phase}_s", pa.float64()) for phase in PHASES),
        pa.field("policy_version", pa.int64()),
        # Multi-agent episodes: the seat this row played and its agent's name (null otherwise).
        pa.field("seat", pa.string()),
        pa.field("agent_name", pa.string()),
        # Per model call, the task's per-turn reward (Trace.set_turn_reward; null for a call
        # without one); the column is null when no turn got one.
        pa.field("turn_rewards", pa.list_(pa.float64())),
        # The full Trace as JSON: the lossless record every other column is a view of.
        # large_string because one batch of long agent traces can pass 2 GiB of text.
        pa.field("trace_json", pa.large_string()),
    ],
    metadata=_metadata("traces"),
)
"""One row per rollout attempt."""

TOKEN_IDS_TYPE = pa.list_(pa.int32())

SAMPLE_SCHEMA = pa.schema(
    [
        pa.field("schema_version", pa.int16(), nullable=False),
        pa.field("run_id", pa.string()),
        pa.field("trace_id", pa.string(), nullable=False),
        pa.field("episode_id", pa.string()),
        pa.field("task_key", pa.string(), nullable=False),
        pa.field("rollout_index", pa.int64(), nullable=False),
        pa.field("attempt", pa.int64(), nullable=False),
        pa.field("branch", pa.int64(), nullable=False),
        pa.field("num_branches", pa.int64(), nullable=False),
        pa.field("messages", MESSAGES_TYPE),
        pa.field("prompt_token_ids", TOKEN_IDS_TYPE),
        pa.field("completion_token_ids", TOKEN_IDS_TYPE),
        # 1 for tokens the model sampled, 0 for tokens the environment inserted between turns.
        pa.field("completion_mask", pa.list_(pa.int8())),
        # The logprobs the inference engine returned for the sampled tokens (0.0 on inserted
        # ones): the behaviour policy's, for importance-sampling correction; a trainer
        # recomputes its own old logprobs.
        pa.field("completion_logprobs", pa.list_(pa.float64())),
        pa.field("reward", pa.float64()),
        pa.field("advantage", pa.float64()),
        pa.field("ok", pa.bool_(), nullable=False),
        pa.field("stop_condition", pa.string()),
        pa.field("model", pa.string()),
        pa.field("policy_version", pa.int64()),
        pa.field("seat", pa.string()),
        pa.field("agent_name", pa.string()),
        # Why the token columns are null: "missing" (a call came back without token ids) or
        # "prefix_break" (a later prompt does not extend the earlier prompt + completion).
        pa.field("token_error", pa.string()),
        # The branch's last answered call's finish_reason ("stop", "length", "tool_calls"...).
        pa.field("finish_reason", pa.string()),
        # Whether a call of the branch stopped at its token limit (finish_reason "length").
        pa.field("truncated", pa.bool_()),
        # Set on per-turn samples (to_samples(on_prefix_break="per_turn")): the index of the call
        # this row is, out of a branch whose turns did not line up. Null on whole-branch rows.
        pa.field("turn", pa.int64()),
        # Per completion token: the task's per-turn reward (Trace.set_turn_reward) on each
        # turn's last sampled token, 0.0 elsewhere; null when no turn of the sample got one.
        pa.field("completion_rewards", pa.list_(pa.float64())),
    ],
    metadata=_metadata("samples"),
)
"""The training view: one row per branch (one linear context = one sample)."""


def schema_version(schema: pa.Schema) -> int | None:
    """The vfray schema version stored in a schema's metadata, or None when absent."""
    raw = (schema.metadata or {}).get(SCHEMA_VERSION_KEY)
    return int(raw) if raw is not None else None
