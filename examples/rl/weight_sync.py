"""Asynchronous RL against a vLLM server: stream groups while training, push new weights between
steps, and keep groups at most one policy version old.

Against vLLM (the RL control plane is a dev-mode feature):

    VLLM_SERVER_DEV_MODE=1 vllm serve Qwen/Qwen3-0.6B \\
        --weight-transfer-config '{"backend": "nccl"}' --logprobs-mode processed_logprobs
    python examples/rl/weight_sync.py --base-url http://localhost:8000/v1 --model Qwen/Qwen3-0.6B

Without a GPU, ``python examples/rl/weight_sync.py`` runs the same loop against the scripted
model server, which stands in for vLLM's ``/pause``, ``/update_weights`` and ``/resume``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import Iterator

import vfray as vf
from vfray.models.scripted.server import ScriptedModel, scripted_server
from vfray.train.weight_sync import VLLMWeights


class QA(vf.TaskData):
    answer: str


class Sum(vf.Task[QA]):
    @vf.reward
    def correct(self, trace: vf.Trace) -> bool:
        return (trace.last_reply or "").strip() == self.data.answer


def tasks(n: int) -> Iterator[Sum]:
    for i in range(n):
        yield Sum(QA(prompt=f"What is {i} + {i}?", answer=str(2 * i)), key=str(i))


async def push_weights(weights: VLLMWeights, step: int) -> None:
    """The trainer's side of one update. With vLLM's NCCL backend: POST /start_weight_update,
    then /update_weights (in a thread) while NCCLWeightTransferEngine.trainer_send_weights
    broadcasts the parameters, then /finish_weight_update (see vLLM's
    examples/rl/rlhf_http_nccl.py; /init_weight_transfer_engine once before the loop)."""
    await weights.post("/update_weights", {"update_info": {"names": [], "step": step}})


async def train(base_url: str, model: str, steps: int) -> None:
    weights = VLLMWeights(base_url)
    with vf.Farm(model, base_url=base_url, harness="null", backend="local", progress=False) as farm:
        farm.set_policy_version(0)
        step = 0
        stream = farm.stream(tasks(4 * steps), rollouts_per_task=4, max_staleness=1)
        async for group in stream:
            print(f"step {step}: task {group.episode.task.key} rewards {group.rewards}")
            # ... the trainer's update on this group's samples goes here ...
            step += 1
            async with weights.update(farm, step):  # paused: calls wait, versions switch
                await push_weights(weights, step)
            if step == steps:
                break
        print(f"groups refused as stale: {farm.stale_groups}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", help="a vLLM server's /v1 URL (default: scripted)")
    parser.add_argument("--model", default="scripted")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        url = args.base_url or stack.enter_context(scripted_server(ScriptedModel("arithmetic")))
        asyncio.run(train(url, args.model, args.steps))


if __name__ == "__main__":
    main()
