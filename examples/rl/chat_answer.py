"""The chat completion the example policies' endpoints answer (``policy.py``'s character-level
policy, ``trl_grpo.py``'s tiny Llama), built the way vLLM answers a training client: the
prompt's token ids (``prompt_token_ids``) and the completion's (``choices[0].token_ids``) when
asked with ``return_token_ids``, and each sampled token's logprob when asked with ``logprobs``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any


def chat_answer(
    body: dict[str, Any],
    prompt: list[int],
    ids: list[int],
    logprobs: list[float],
    finish: str,
    text: str,
    token_text: Callable[[list[int]], str],
    model: str,
) -> dict[str, Any]:
    """The answer to the request ``body``: ``ids`` sampled after ``prompt`` with ``logprobs``,
    ended by ``finish``, read as ``text``; ``token_text`` names a token (given as ``[id]``) in
    the logprobs; ``model`` is the name given when the request has none."""
    choice: dict[str, Any] = {
        "index": 0,
        "message": {"role": "assistant", "content": text},
        "finish_reason": finish,
    }
    if body.get("logprobs"):
        choice["logprobs"] = {
            "content": [
                {"token": token_text([t]), "logprob": lp, "bytes": None, "top_logprobs": []}
                for t, lp in zip(ids, logprobs, strict=True)
            ]
        }
    answer: dict[str, Any] = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", model),
        "choices": [choice],
        "usage": {
            "prompt_tokens": len(prompt),
            "completion_tokens": len(ids),
            "total_tokens": len(prompt) + len(ids),
        },
    }
    if body.get("return_token_ids"):
        answer["prompt_token_ids"] = prompt
        choice["token_ids"] = ids
    return answer
