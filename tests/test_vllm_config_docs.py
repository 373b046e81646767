"""examples/configs/vllm.toml and the training guide's vLLM section agree: the same
``vllm serve`` line (with ``--logprobs-mode processed_logprobs``, so the recorded logprobs are
those of the distribution sampled from) and a config that asks for token ids and logprobs."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from vfray.config import load_config

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "examples" / "configs" / "vllm.toml"
GUIDE = REPO / "docs" / "guides" / "training.md"


def _serve_lines(text: str) -> list[list[str]]:
    return [
        shlex.split(match.group(1))
        for match in re.finditer(r"^[#\s]*(vllm serve .+)$", text, flags=re.MULTILINE)
    ]


def _vllm_section(text: str) -> str:
    start = text.index("**With vLLM.**")
    end = text.index("\n**", start + 1)
    return text[start:end]


def test_the_vllm_config_and_the_guide_serve_the_same_way() -> None:
    (config_line,) = _serve_lines(CONFIG.read_text())
    section = _vllm_section(GUIDE.read_text())
    (guide_line,) = _serve_lines(section)
    assert config_line == guide_line
    flags = dict(zip(config_line[3::2], config_line[4::2], strict=True))
    assert flags["--logprobs-mode"] == "processed_logprobs"
    assert "examples/configs/vllm.toml" in section and "return_tokens = true" in section


def test_the_vllm_config_asks_for_tokens_and_loads() -> None:
    config = load_config(CONFIG)
    assert config.sampling.return_tokens is True
    assert config.model.name in _vllm_section(GUIDE.read_text())
