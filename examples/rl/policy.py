"""A tiny character-level torch policy and the OpenAI-compatible endpoint that serves it.

The vocabulary is the printable ASCII characters plus four specials, so no tokenizer is
downloaded. The endpoint answers ``POST /v1/chat/completions`` the way vLLM does when asked
for training data: the prompt's token ids (``prompt_token_ids``), the completion's
(``choices[0].token_ids``, the end-of-sequence token included) and each sampled token's
logprob (``choices[0].logprobs``). It is served with vfray's own ``serve_in_thread``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import torch
from chat_answer import chat_answer
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from vfray.endpoints.serving import serve_in_thread

PAD, BOS, EOS, SEP = 0, 1, 2, 3
"""Padding, start of the conversation, end of a reply, end of a message."""
FIRST_CHAR = 4
VOCAB = FIRST_CHAR + 95  # the printable ASCII characters, ' ' to '~'
DIGITS = [FIRST_CHAR + ord(c) - 32 for c in "0123456789"]
OUTPUTS = [*DIGITS, EOS]
"""The tokens a reply may use (the others are masked out of the policy's distribution)."""


def encode(text: str) -> list[int]:
    return [FIRST_CHAR + ord(c) - 32 if " " <= c <= "~" else FIRST_CHAR for c in text]


def decode(ids: list[int]) -> str:
    return "".join(chr(i - FIRST_CHAR + 32) for i in ids if i >= FIRST_CHAR)


def render(messages: list[dict[str, Any]]) -> list[int]:
    """The chat template: BOS, then each message's characters followed by SEP. A reply's
    tokens are its characters and EOS, so a next turn's prompt extends the last one's
    prompt + completion only where EOS is rendered as SEP (single-turn tasks here)."""
    ids = [BOS]
    for message in messages:
        content = message.get("content")
        ids += [*encode(content if isinstance(content, str) else ""), SEP]
    return ids


def _token(ids: list[int]) -> str:
    """A token as the logprobs name it (EOS has no character)."""
    return decode(ids) or "<eos>"


class CharPolicy(torch.nn.Module):
    """Embedding -> GRU -> logits; the distribution is restricted to :data:`OUTPUTS`."""

    def __init__(self, hidden: int = 64) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, 32)
        self.rnn = torch.nn.GRU(32, hidden, batch_first=True)
        self.head = torch.nn.Linear(hidden, VOCAB)
        mask = torch.full((VOCAB,), float("-inf"))
        mask[OUTPUTS] = 0.0
        self.register_buffer("allowed", mask)

    def forward(self, ids: torch.Tensor, state: torch.Tensor | None = None) -> Any:
        out, state = self.rnn(self.embed(ids), state)
        return torch.log_softmax(self.head(out) + self.allowed, dim=-1), state

    def token_logprobs(self, input_ids: torch.Tensor) -> torch.Tensor:
        """``[B, L]``: the logprob of each token given the ones before it (0 at position 0)."""
        logprobs, _ = self(input_ids)
        picked = logprobs[:, :-1].gather(-1, input_ids[:, 1:, None]).squeeze(-1)
        return torch.nn.functional.pad(picked, (1, 0))


class PolicyServer:
    """The ASGI app serving ``policy``; ``lock`` is held while it samples, and by the trainer
    while it changes the weights, so a reply never mixes two versions."""

    def __init__(self, policy: CharPolicy, lock: threading.Lock, seed: int = 0) -> None:
        self.policy, self.lock = policy, lock
        self.generator = torch.Generator().manual_seed(seed)
        self.app = Starlette(
            routes=[Route("/v1/chat/completions", self.complete, methods=["POST"])]
        )

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)

    def sample(self, prompt: list[int], max_tokens: int) -> tuple[list[int], list[float], str]:
        device = next(self.policy.parameters()).device
        ids: list[int] = []
        logprobs: list[float] = []
        with self.lock, torch.no_grad():
            step, state = self.policy(torch.tensor([prompt], device=device))
            while True:
                dist = step[0, -1].float().cpu()
                token = int(torch.multinomial(dist.exp(), 1, generator=self.generator))
                ids.append(token)
                logprobs.append(float(dist[token]))
                if token == EOS:
                    return ids, logprobs, "stop"
                if len(ids) >= max_tokens:
                    return ids, logprobs, "length"
                step, state = self.policy(torch.tensor([[token]], device=device), state)

    async def complete(self, request: Request) -> JSONResponse:
        body = await request.json()
        if body.get("stream"):
            return JSONResponse({"error": {"message": "streaming is not served"}}, 400)
        prompt = render(body.get("messages") or [])
        max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        ids, logprobs, finish = self.sample(prompt, max_tokens)
        text = decode(ids)
        answer = chat_answer(body, prompt, ids, logprobs, finish, text, _token, "char-policy")
        return JSONResponse(answer)


@contextlib.contextmanager
def serve_policy(policy: CharPolicy, lock: threading.Lock, seed: int = 0) -> Iterator[str]:
    """Serve ``policy`` on 127.0.0.1; yields the base URL (ending in ``/v1``)."""
    with serve_in_thread(PolicyServer(policy, lock, seed)) as url:
        yield f"{url}/v1"
