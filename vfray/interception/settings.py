"""The interception's own bounds, the config tree's ``interception`` section: how long an
upstream call or a silent stream may take, how large and how stalled a request body may be, and
how often a silent stream gets an SSE keepalive.

Each was a fixed constant once (600 s in all for any upstream call, even a stream; an 8 MiB
body cap; no keepalive; no body timeout), which cut long reasoning calls with a 504.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

MIB = 1024 * 1024


class InterceptionSettings(BaseModel):
    """Timeouts, the body cap and SSE keepalives of the interception (every backend)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    upstream_timeout: float = Field(
        1800.0,
        gt=0,
        description="seconds a non-streamed upstream call may take in all before it is "
        "answered 504 (a long reasoning call can take many minutes)",
    )
    stream_idle_timeout: float = Field(
        600.0,
        gt=0,
        description="seconds a streamed upstream call may stay silent (its head, or between "
        "reads) before it is cut with a 504; a stream has no total limit",
    )
    max_body_bytes: int = Field(
        64 * MIB,
        ge=1024,
        description="largest request body accepted from an agent, in bytes (413 past it; "
        "long multimodal contexts carry base64 images)",
    )
    body_timeout: float = Field(
        60.0,
        gt=0,
        description="seconds a request body may stall midway (no bytes arriving) before it "
        "is answered 408 and the connection closed",
    )
    sse_keepalive: float = Field(
        15.0,
        ge=0,
        description="seconds of upstream silence in a stream before the client gets a "
        "': keepalive' SSE comment, so idle-timeouts between it and the agent do not cut a "
        "long think (0: never)",
    )
    token_in: bool = Field(
        False,
        description="token-in/token-out: send each later turn of a branch as the branch's exact "
        "token ids plus the new messages' bridge tokens (vLLM's /v1/chat/completions/tokens, "
        "vLLM >= 0.20), so a re-rendered history never breaks a training sample; Anthropic and "
        "Responses calls go as chat and are answered in their dialect; a call that cannot be "
        "sent so goes as messages (or as it came), with a note on its trace",
    )
    tokenizer: str | None = Field(
        None,
        description="with token_in: a model or tokenizer folder (tokenizer.json and its chat "
        "template) that renders the bridge tokens here; unset: the endpoint's POST /tokenize",
    )
