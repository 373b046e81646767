"""Training batches per second: :func:`vfray.train.build_batch` (Arrow -> numpy, then torch
tensors when torch is installed) against building the same padded batches from Python dicts,
the way a loop over ``samples.to_pylist()`` rows does, at batch sizes 64-1024.

The samples are synthetic but shaped like agent rollouts: a prompt of 100-400 tokens and 2-4
turns of 20-120 sampled tokens with 10-60 environment tokens between them. The dict path is
timed twice: from rows already in Python (``to_pylist()`` not counted: the ratio's floor), and
from the same Arrow slices a stream yields (``to_pylist()`` counted). Both paths are checked
to build identical arrays.

Rates are samples per CPU second of this process: on a shared, loaded machine wall time
measures the neighbours more than the code. Each repeat times every path once, one after the
other, so a ratio compares paths under the same load; the ratios printed are the minimum and the
median over ``--repeats``, the rates the best.

    python benchmarks/train_loader.py [--samples 10000] [--repeats 7] [--sizes 64,128]

Issue 32's other goal, token-in/token-out's cost per turn through the interception against
messages at 64 sessions, is measured by ``benchmarks/token_in.py`` (it needs the scripted model
server and a tokenizer; ``--instructions`` counts under valgrind).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np
import pyarrow as pa

from vfray.traces.schema import SAMPLE_SCHEMA
from vfray.train import build_batch


def synthetic_samples(n: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    prompts, completions, masks, logprobs = [], [], [], []
    for _ in range(n):
        prompts.append(rng.integers(0, 50_000, rng.integers(100, 400)).tolist())
        ids: list[int] = []
        mask: list[int] = []
        for turn in range(int(rng.integers(2, 5))):
            if turn:
                inserted = int(rng.integers(10, 60))
                ids += rng.integers(0, 50_000, inserted).tolist()
                mask += [0] * inserted
            sampled = int(rng.integers(20, 120))
            ids += rng.integers(0, 50_000, sampled).tolist()
            mask += [1] * sampled
        completions.append(ids)
        masks.append(mask)
        logprobs.append((-rng.random(len(ids))).tolist())
    columns: dict[str, Any] = {
        "prompt_token_ids": prompts,
        "completion_token_ids": completions,
        "completion_mask": masks,
        "completion_logprobs": logprobs,
        "advantage": rng.normal(size=n).tolist(),
        "reward": rng.random(n).tolist(),
        "policy_version": rng.integers(0, 10, n).tolist(),
        "trace_id": [f"t{i}" for i in range(n)],
        # The per-sample fields a real run has too (groups of 8).
        "episode_id": [f"e{i // 8}" for i in range(n)],
        "rollout_index": [i % 8 for i in range(n)],
        "finish_reason": ["stop"] * n,
        "truncated": [False] * n,
    }
    arrays = [
        pa.array(columns[f.name], type=f.type) if f.name in columns else pa.nulls(n, type=f.type)
        for f in SAMPLE_SCHEMA
    ]
    return pa.Table.from_arrays(arrays, schema=SAMPLE_SCHEMA)


def from_dicts(rows: list[dict[str, Any]], pad_id: int = 0) -> dict[str, np.ndarray]:
    """What a per-row loader does: concatenate, pad and mask each row in Python."""
    rows = [r for r in rows if r["advantage"] is not None and r["completion_token_ids"]]
    width = max(len(r["prompt_token_ids"]) + len(r["completion_token_ids"]) for r in rows)
    ids, attn, loss, old = [], [], [], []
    for r in rows:
        seq = r["prompt_token_ids"] + r["completion_token_ids"]
        pad = width - len(seq)
        n_prompt = len(r["prompt_token_ids"])
        ids.append(seq + [pad_id] * pad)
        attn.append([1] * len(seq) + [0] * pad)
        loss.append([0] * n_prompt + list(r["completion_mask"]) + [0] * pad)
        old.append([0.0] * n_prompt + list(r["completion_logprobs"]) + [0.0] * pad)
    return {
        "input_ids": np.array(ids, dtype=np.int64),
        "attention_mask": np.array(attn, dtype=np.int64),
        "loss_mask": np.array(loss, dtype=np.int64),
        "old_logprobs": np.array(old, dtype=np.float32),
        "advantages": np.array([r["advantage"] for r in rows], dtype=np.float32),
        "policy_version": np.array([r["policy_version"] for r in rows], dtype=np.int64),
    }


def _seconds(fn: Any) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def _ratios(fast: list[float], slow: list[float]) -> str:
    """min/median over the repeats of slow/fast CPU seconds (each pair timed back to back)."""
    ratios = [s / f for f, s in zip(fast, slow, strict=True)]
    return f"{min(ratios):4.1f}x/{statistics.median(ratios):4.1f}x"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument(
        "--sizes", default="64,128,256,512,1024", help="batch sizes, comma-separated"
    )
    args = parser.parse_args()
    try:
        import torch
    except ImportError:
        torch = None
    table = synthetic_samples(args.samples)
    rows = table.to_pylist()
    tokens = sum(len(r["prompt_token_ids"]) + len(r["completion_token_ids"]) for r in rows)
    print(f"{args.samples} samples, {tokens / args.samples:.0f} tokens each on average")
    print(
        "batch  vfray (Arrow->numpy) samples/s  +torch tensors  dicts samples/s  ratio min/med"
        "  Arrow->dicts samples/s  ratio min/med"
    )
    for size in (int(s) for s in args.sizes.split(",")):
        slices = [table.slice(i, size) for i in range(0, args.samples, size)]
        dict_slices = [rows[i : i + size] for i in range(0, args.samples, size)]
        first = build_batch(slices[0])
        reference = from_dicts(dict_slices[0])
        for name, array in reference.items():
            assert np.array_equal(getattr(first, name), array), name

        def arrow(slices: list[pa.Table] = slices) -> None:
            for s in slices:
                build_batch(s)

        def arrow_torch(slices: list[pa.Table] = slices) -> None:
            for s in slices:
                b = build_batch(s)
                for name in ("input_ids", "attention_mask", "loss_mask", "old_logprobs"):
                    torch.from_numpy(getattr(b, name))

        def dicts(dict_slices: list[list[dict[str, Any]]] = dict_slices) -> None:
            for s in dict_slices:
                from_dicts(s)

        def arrow_dicts(slices: list[pa.Table] = slices) -> None:
            for s in slices:
                from_dicts(s.to_pylist())

        times: dict[str, list[float]] = {"a": [], "t": [], "d": [], "ad": []}
        for _ in range(args.repeats):
            times["a"].append(_seconds(arrow))
            if torch is not None:
                times["t"].append(_seconds(arrow_torch))
            times["d"].append(_seconds(dicts))
            times["ad"].append(_seconds(arrow_dicts))
        rate = {k: args.samples / min(v) if v else float("nan") for k, v in times.items()}
        print(
            f"{size:5d}  {rate['a']:31,.0f}  {rate['t']:14,.0f}  {rate['d']:15,.0f}"
            f"  {_ratios(times['a'], times['d']):>15}  {rate['ad']:22,.0f}"
            f"  {_ratios(times['a'], times['ad']):>15}"
        )


if __name__ == "__main__":
    main()
