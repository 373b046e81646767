"""The GRPO example (``examples/rl``) for a few steps, end to end: its own char-level policy
served through an OpenAI-compatible endpoint, rollouts through ``Farm.stream`` on the local
backend, batches from :class:`vfray.train.torch.StreamDataset`, weight updates and policy
versions. Learning itself is measured by the example (benchmarks/README.md), not here."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

import vfray as vf

pytest.importorskip("torch")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "rl"


def test_a_few_grpo_steps_run_end_to_end(tmp_path: Path) -> None:
    sys.path.insert(0, str(EXAMPLE))
    try:
        import grpo
    finally:
        sys.path.remove(str(EXAMPLE))
    steps = 4
    history = grpo.train(
        steps=steps, groups_per_step=2, group_size=4, output_dir=str(tmp_path), log=False
    )
    assert len(history.rewards) == steps
    assert all(0.0 <= r <= 1.0 for r in history.rewards)
    # The trainer recomputed the sampled tokens' logprobs with the weights that sampled them.
    assert history.first_mismatch is not None and history.first_mismatch < 1e-4
    # Policy versions reach the batches: the first batch was sampled before any update, a
    # batch never carries a version set after it (version k is set after step k - 1), and the
    # versions the trainer set after its updates appear on later batches (the one-slot queues
    # keep a batch at most a step or two behind).
    versions = history.versions
    assert versions[0] == 0.0
    assert all(v <= step for step, v in enumerate(versions)), versions
    assert versions[-1] >= 1.0, versions
    assert history.samples >= steps * 8
    # The stream's thread is gone and the rows are in the run folder, tokens and all.
    assert not [t for t in threading.enumerate() if t.name == "vfray-stream"]
    (run_dir,) = [p.parent for p in tmp_path.glob("*/*/config.json")]
    samples = vf.to_samples(vf.RunResult(run_dir).final_traces)
    assert samples.num_rows >= steps * 8
    assert len(set(samples.column("policy_version").to_pylist())) >= 2  # stamped per call
    assert samples.column("token_error").null_count == samples.num_rows
    assert samples.column("completion_logprobs").null_count == 0


def test_the_grpo_notebook_is_committed_without_outputs() -> None:
    import nbformat

    book = nbformat.read(EXAMPLE.parents[1] / "notebooks" / "grpo.ipynb", as_version=4)
    code = [c for c in book.cells if c.cell_type == "code"]
    assert code and all(c.outputs == [] and c.execution_count is None for c in code)
    assert any("grpo.train(" in c.source for c in code)
