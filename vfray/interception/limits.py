"""Per-rollout turn and token limits, checked by the interception before each model call.

Counting (caps are soft by one turn: a call's size is only known after it ran, so the call that
crosses a token cap completes and the next one is refused; ``max_turns`` is exact):

- turns: calls that produced a reply (``Trace.num_turns``);
- input tokens: per branch, the largest ``usage.input_tokens`` of its calls (a branch is one
  growing context, so its last call's prompt holds every earlier one), summed over branches;
- output tokens: the sum of ``usage.output_tokens`` over all calls;
- total tokens: input tokens (as above) plus output tokens.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from vfray.trace import StopCondition, Trace


def input_tokens(trace: Trace) -> int:
    """Distinct prompt tokens the rollout consumed (see the module docstring)."""
    per_branch: dict[int, int] = {}
    for call in trace.calls:
        per_branch[call.branch] = max(per_branch.get(call.branch, 0), call.usage.input_tokens)
    return sum(per_branch.values())


def output_tokens(trace: Trace) -> int:
    return sum(call.usage.output_tokens for call in trace.calls)


class Limits(BaseModel):
    """Budgets of one rollout; ``None`` means unlimited."""

    model_config = ConfigDict(frozen=True)

    max_turns: int | None = Field(default=None, ge=0)
    max_input_tokens: int | None = Field(default=None, ge=0)
    max_output_tokens: int | None = Field(default=None, ge=0)
    max_total_tokens: int | None = Field(default=None, ge=0)
    max_user_turns: int | None = Field(default=None, ge=0)
    """User messages per rollout (a prompt-less task's opening one included). Not a model call
    limit: the rollout counts them between segments (:mod:`vfray.harnesses.session`)."""

    def reached(self, trace: Trace) -> StopCondition | None:
        """The first limit the trace has reached, in the order of the fields, or None."""
        if self.max_turns is not None and trace.num_turns >= self.max_turns:
            return StopCondition.MAX_TURNS
        token_caps = (self.max_input_tokens, self.max_output_tokens, self.max_total_tokens)
        if all(cap is None for cap in token_caps):
            return None
        used_in = input_tokens(trace)
        used_out = output_tokens(trace)
        if self.max_input_tokens is not None and used_in >= self.max_input_tokens:
            return StopCondition.MAX_INPUT_TOKENS
        if self.max_output_tokens is not None and used_out >= self.max_output_tokens:
            return StopCondition.MAX_OUTPUT_TOKENS
        if self.max_total_tokens is not None and used_in + used_out >= self.max_total_tokens:
            return StopCondition.MAX_TOTAL_TOKENS
        return None
