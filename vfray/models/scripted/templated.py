"""The scripted model with a real tokenizer and chat template, as vLLM serves a model.

With a :class:`~vfray.endpoints.chat_template.ChatTemplate`, a chat request's prompt ids are
the template's rendering of its messages (or, on vLLM's ``/v1/chat/completions/tokens``, the
``tokens`` the request carries), and the reply is tokenized as a model samples it: an optional
``<think>`` block, the text (or a Hermes ``<tool_call>``), then the stop token (the template's
``eos_token``), which vLLM returns among the completion ids. A template that drops earlier
reasoning, or renders a reply otherwise than it was sampled, then breaks the next prompt's
prefix exactly as a reasoning model behind vLLM does.
"""

from __future__ import annotations

import json
from typing import Any

from vfray.endpoints.chat_template import ChatTemplate
from vfray.models.scripted.conversation import (
    Conversation,
    Decision,
    Reply,
    ToolCall,
    token_logprob,
)
from vfray.models.scripted.wire import BadRequest, Json


def prompt_ids(template: ChatTemplate, body: Json, tokens: Any) -> list[int]:
    """The request's prompt ids: its ``tokens`` (checked), else the rendered messages."""
    if tokens is None:
        tools = body.get("tools") if isinstance(body.get("tools"), list) else None
        try:
            return template.tokenize_chat(body["messages"], tools=tools)
        except Exception as exc:
            raise BadRequest(f"the chat template failed: {type(exc).__name__}: {exc}") from None
    size = template.tokenizer.get_vocab_size()
    if not isinstance(tokens, list) or not tokens:
        raise BadRequest("'tokens' must be a non-empty list of token ids", "tokens")
    if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < size for t in tokens):
        raise BadRequest(f"'tokens' must be token ids in [0, {size})", "tokens")
    return list(tokens)


def templated_reply(
    template: ChatTemplate,
    decision: Decision,
    conv: Conversation,
    prompt: list[int],
    *,
    call_id: str,
    think: str | None,
) -> Reply:
    """The reply to ``decision``, tokenized by ``template`` (token ids always returned when
    the request asked; vLLM's ``return_token_ids``)."""
    tool_call = None
    if decision.tool_call is not None:
        name, args = decision.tool_call
        tool_call = ToolCall(id=call_id, name=name, arguments=json.dumps(args))
        visible = json.dumps({"name": name, "arguments": args})
        sampled = f"<tool_call>\n{visible}\n</tool_call>"
    else:
        visible = sampled = decision.text
    head = template.encode(f"<think>{think}</think>") if think else []
    body = template.encode(sampled)
    ids = head + body
    finish = "tool_calls" if tool_call is not None else "stop"
    if conv.max_tokens is not None and len(ids) >= conv.max_tokens:
        ids, finish = ids[: conv.max_tokens], "length"
    elif template.eos_token_id is not None:
        ids = [*ids, template.eos_token_id]
    # One piece per token: the think block's and the stop token's are empty (reasoning goes in
    # its own field), the text's are the text's increments, so the pieces join to the content.
    pieces = [""] * min(len(head), len(ids))
    shown = ids[len(head) : len(head) + len(body)]
    previous = ""
    for i in range(len(shown)):
        text = template.decode(shown[: i + 1])
        pieces.append(text[len(previous) :])
        previous = text
    pieces += [""] * (len(ids) - len(pieces))
    text = "".join(pieces) if tool_call is None else ""
    return Reply(
        text=text if tool_call is None else "",
        tool_call=tool_call,
        finish=finish,
        pieces=pieces,
        prompt_token_ids=prompt if conv.want_tokens else [],
        prompt_tokens=len(prompt),
        with_tokens=conv.want_tokens,
        token_ids=ids if conv.want_tokens else [],
        logprobs=[token_logprob(str(t), i) for i, t in enumerate(ids)] if conv.want_tokens else [],
        reasoning=think or "",
    )


def tokenize_answer(template: ChatTemplate, body: Json) -> Json:
    """vLLM's ``POST /tokenize``: a chat (``messages``, ``tools``, ``add_generation_prompt``)
    or a ``prompt`` text, as token ids."""
    if isinstance(body.get("prompt"), str):
        tokens = template.encode(body["prompt"])
    elif isinstance(body.get("messages"), list):
        gen = body.get("add_generation_prompt", True)
        if not isinstance(gen, bool):
            raise BadRequest("'add_generation_prompt' must be a boolean", "add_generation_prompt")
        tools = body.get("tools") if isinstance(body.get("tools"), list) else None
        try:
            tokens = template.tokenize_chat(
                body["messages"], tools=tools, add_generation_prompt=gen
            )
        except Exception as exc:
            raise BadRequest(f"the chat template failed: {type(exc).__name__}: {exc}") from None
    else:
        raise BadRequest("/tokenize takes 'messages' or 'prompt'")
    return {"count": len(tokens), "max_model_len": 1 << 20, "tokens": tokens}
