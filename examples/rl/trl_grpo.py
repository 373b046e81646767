"""TRL's ``GRPOTrainer`` trained on vfray's rollouts (:class:`vfray.train.trl.TRLRollouts` as
its ``rollout_func``), on CPU, with nothing downloaded: a tiny random-weight Llama built from a
``transformers`` config and a character-level tokenizer with a ChatML template built here.

The policy is served to vfray's interception by a small OpenAI-compatible endpoint in this file
(as vLLM answers a training client: ``prompt_token_ids``, ``choices[0].token_ids`` and
per-token logprobs), sampling from the very model object the trainer updates. TRL calls the
``rollout_func`` between its optimizer steps, so the endpoint never samples from weights that
are changing.

The task: reply with digits only (``--turns 2``: then again when the user says "more"); the
reward is the share of the replies' characters that are digits (10 of the 41 tokens).
Measured here, 40 steps of 4 groups x 4 (2 shared cores, loaded by other work): single-turn,
mean reward 0.24 (first 5 steps) -> 0.94 (last 5) in 100 s; ``--turns 2``, 0.25 -> 0.94 in
185 s.

    python examples/rl/trl_grpo.py --steps 40
"""

from __future__ import annotations

import argparse
import contextlib
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import torch
from chat_answer import chat_answer
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import vfray as vf
from vfray.endpoints.serving import serve_in_thread
from vfray.train.trl import TRLRollouts, vfray_advantage, vfray_reward

SPECIALS = ["<pad>", "<|im_start|>", "<|im_end|>"]
CHARS = list("0123456789abcdefghijklmnopqrstuvwxyz \n")
TEMPLATE = (
    "{%- for m in messages -%}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endfor -%}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif -%}"
)


def build_tokenizer() -> Any:
    """A character-level fast tokenizer (BPE with no merges) with a ChatML template."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIALS + CHARS)}
    inner = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<pad>"))
    inner.add_special_tokens(SPECIALS)
    inner.decoder = decoders.Fuse()  # characters back to back (the default joins with spaces)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=inner, pad_token="<pad>", eos_token="<|im_end|>", bos_token=None
    )
    tokenizer.chat_template = TEMPLATE
    return tokenizer


def build_model(tokenizer: Any, seed: int = 0) -> Any:
    """A 2-layer Llama with random weights (~50k parameters)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config)


def encode_chat(tokenizer: Any, messages: list[dict[str, Any]]) -> list[int]:
    """The token ids of ``messages`` rendered for a reply (the generation prompt added)."""
    rendered = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=True
    )
    return [int(t) for t in rendered["input_ids"]]


class HFPolicyServer:
    """``POST /v1/chat/completions`` answered by ``model``: the prompt rendered by the
    tokenizer's chat template, tokens sampled at temperature 1 until EOS or ``max_tokens``."""

    def __init__(self, model: Any, tokenizer: Any, seed: int = 0) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.generator = torch.Generator().manual_seed(seed)
        self.lock = threading.Lock()
        self.app = Starlette(
            routes=[Route("/v1/chat/completions", self.complete, methods=["POST"])]
        )

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)

    def sample(self, prompt: list[int], max_tokens: int) -> tuple[list[int], list[float], str]:
        ids: list[int] = []
        logprobs: list[float] = []
        eos = self.tokenizer.eos_token_id
        with self.lock, torch.no_grad():
            while True:
                logits = self.model(torch.tensor([prompt + ids])).logits[0, -1].float()
                dist = torch.log_softmax(logits, -1)
                token = int(torch.multinomial(dist.exp(), 1, generator=self.generator))
                ids.append(token)
                logprobs.append(float(dist[token]))
                if token == eos:
                    return ids, logprobs, "stop"
                if len(ids) >= max_tokens:
                    return ids, logprobs, "length"

    async def complete(self, request: Request) -> JSONResponse:
        body = await request.json()
        if body.get("stream"):
            return JSONResponse({"error": {"message": "streaming is not served"}}, 400)
        messages = [
            {"role": m["role"], "content": m.get("content") or ""}
            for m in body.get("messages") or []
        ]
        prompt = encode_chat(self.tokenizer, messages)
        max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 8)
        ids, logprobs, finish = self.sample(prompt, max_tokens)
        # Special tokens sampled mid-reply stay in the text (the template renders them back to
        # the same ids next turn); only the closing EOS is left out, as the template adds it.
        text = self.tokenizer.decode(ids[:-1] if finish == "stop" else ids)
        answer = chat_answer(
            body, prompt, ids, logprobs, finish, text, self.tokenizer.decode, "tiny-llama"
        )
        return JSONResponse(answer)


@contextlib.contextmanager
def serve_model(model: Any, tokenizer: Any, seed: int = 0) -> Iterator[str]:
    """Serve ``model`` on 127.0.0.1; yields the base URL (ending in ``/v1``)."""
    with serve_in_thread(HFPolicyServer(model, tokenizer, seed)) as url:
        yield f"{url}/v1"


class Digits(vf.TaskData):
    turns: int = 1


class DigitsTask(vf.Task[Digits]):
    @vf.user
    def more(self, trace: vf.Trace) -> str | None:
        """Asks for more until the conversation has ``turns`` user messages."""
        asked = sum(m.role == "user" for m in trace.messages)
        return "more" if asked < self.data.turns else None

    @vf.reward
    def digits(self, trace: vf.Trace) -> float:
        """The share of the assistant's characters (all its replies) that are digits."""
        text = "".join(
            m.content
            for m in trace.messages
            if m.role == "assistant" and isinstance(m.content, str)
        )
        return sum(c.isdigit() for c in text) / len(text) if text else 0.0


def tasks(n: int, turns: int = 1) -> list[DigitsTask]:
    """``n`` tasks; with ``turns`` > 1 each is a conversation (the user says "more"), whose
    sample holds every turn: the user's tokens in between are masked out."""
    return [
        DigitsTask(Digits(prompt=f"{i % 10}", turns=turns), key=f"digits-{i}") for i in range(n)
    ]


def make_farm(url: str, max_concurrent: int, output_dir: str) -> vf.Farm:
    return vf.Farm(
        "tiny-llama",
        base_url=url,
        harness="null",
        runtime="subprocess",
        backend="local",
        max_concurrent=max_concurrent,
        sampling={"max_tokens": 6, "temperature": 1.0},
        output_dir=output_dir,
        progress=False,
    )


def grpo_config(output_dir: str, steps: int, num_generations: int, groups: int, **more: Any) -> Any:
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=output_dir,
        max_steps=steps,
        per_device_train_batch_size=groups * num_generations,
        num_generations=num_generations,
        # vfray's advantages as they are: TRL's centring leaves them unchanged (group mean 0).
        scale_rewards="none",
        reward_weights=more.pop("reward_weights", [1.0, 0.0]),
        learning_rate=more.pop("learning_rate", 1e-2),
        beta=0.0,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        dataloader_num_workers=0,
        seed=more.pop("seed", 0),
        **more,
    )


def train(
    steps: int = 20,
    groups: int = 4,
    num_generations: int = 4,
    out: str = "outputs",
    learning_rate: float = 1e-2,
    turns: int = 1,
) -> Any:
    """Run ``steps`` GRPO steps; the trainer (its ``state.log_history`` holds the rewards)."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from trl import GRPOTrainer

    tokenizer = build_tokenizer()
    model = build_model(tokenizer)
    with (
        serve_model(model, tokenizer) as url,
        make_farm(url, groups * num_generations, out) as farm,
    ):
        rollouts = TRLRollouts(farm, tasks(steps * groups, turns), num_generations=num_generations)
        trainer = GRPOTrainer(
            model=model,
            # vfray's reward rides along with weight 0: logged, not trained on.
            reward_funcs=[vfray_advantage, vfray_reward],
            args=grpo_config(
                f"{out}/trl", steps, num_generations, groups, learning_rate=learning_rate
            ),
            train_dataset=rollouts.dataset(),
            processing_class=tokenizer,
            rollout_func=rollouts,
        )
        trainer.train()
    return trainer


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--num-generations", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--turns", type=int, default=1)
    parser.add_argument("--output-dir", default="outputs")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # a tiny model: threads only fight the farm for the cores
    start = time.monotonic()
    trainer = train(
        args.steps, args.groups, args.num_generations, args.output_dir, args.lr, args.turns
    )
    key = "rewards/vfray_reward/mean"
    rewards = [e[key] for e in trainer.state.log_history if key in e]
    print(f"{len(rewards)} steps in {time.monotonic() - start:.0f} s; mean reward per step:")
    print(" ".join(f"{r:.2f}" for r in rewards))


if __name__ == "__main__":
    main()
