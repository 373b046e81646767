"""A model's tokenizer and chat template, rendered the way HF ``transformers`` renders them.

A model folder (or a tokenizer folder) holds ``tokenizer.json`` (HF ``tokenizers``) and
``tokenizer_config.json`` with the ``chat_template`` (Jinja) and the special tokens; newer ones
keep the template in ``chat_template.jinja``. :class:`ChatTemplate` loads that folder without
``transformers``: the template runs in Jinja's sandbox with the globals HF gives it
(``raise_exception``, ``strftime_now``, the ``tojson`` filter, ``bos_token``/``eos_token``), so
the text, and the token ids, are what ``tokenizer.apply_chat_template`` produces.

The token-in/token-out path (:mod:`vfray.interception.token_in`) renders only the bridge
between two turns with it; the scripted model server renders whole prompts with it, standing in
for vLLM. ``tokenizers`` is an optional dependency, imported when a template is loaded.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from vfray.errors import ConfigError


def _raise(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii)


def _token_text(value: Any) -> str:
    # tokenizer_config.json names a special token as a string or as an AddedToken dict.
    if isinstance(value, dict):
        return str(value.get("content", ""))
    return value if isinstance(value, str) else ""


class ChatTemplate:
    """A tokenizer (``tokenizers.Tokenizer``) with its Jinja chat template."""

    def __init__(
        self, tokenizer: Any, template: str, *, bos_token: str = "", eos_token: str = ""
    ) -> None:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._template = env.from_string(template)
        except jinja2.TemplateError as exc:
            raise ConfigError(f"the chat template does not compile: {exc}") from None
        self.tokenizer = tokenizer
        self.bos_token = bos_token
        self.eos_token = eos_token
        eos = tokenizer.token_to_id(eos_token) if eos_token else None
        self.eos_token_id: int | None = eos
        # The same ids as ``encode`` without the character offsets it works out (tokenizers
        # >= 0.21): ~20-25% less CPU a call, and token-in encodes each turn's new text. A batch
        # of one is never split: it is encoded on the calling thread (the library starts its
        # idle thread pool once, and a fork after it prints no warning).
        self._encode_batch_fast = getattr(tokenizer, "encode_batch_fast", None)

    @classmethod
    def load(cls, path: str | Path) -> ChatTemplate:
        """The tokenizer and template of a model folder (``tokenizer.json`` and
        ``tokenizer_config.json``, or ``chat_template.jinja``)."""
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise ConfigError(
                "a chat template needs the 'tokenizers' package: pip install tokenizers"
            ) from None
        folder = Path(path).expanduser()
        tokenizer_file = folder / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise ConfigError(f"no tokenizer.json in {folder}")
        config_file = folder / "tokenizer_config.json"
        config: dict[str, Any] = {}
        if config_file.is_file():
            config = json.loads(config_file.read_text())
        template = config.get("chat_template")
        jinja_file = folder / "chat_template.jinja"
        if jinja_file.is_file():
            template = jinja_file.read_text()
        if isinstance(template, list):  # named templates: the "default" one
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        if not isinstance(template, str):
            raise ConfigError(f"no chat template in {folder} (tokenizer_config.json)")
        return cls(
            Tokenizer.from_file(str(tokenizer_file)),
            template,
            bos_token=_token_text(config.get("bos_token")),
            eos_token=_token_text(config.get("eos_token")),
        )

    def render(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> str:
        """The prompt text, as ``apply_chat_template(..., tokenize=False)`` renders it."""
        return self._template.render(
            messages=list(messages),
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
            **kwargs,
        )

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, no special tokens added (the template wrote them)."""
        if self._encode_batch_fast is not None:
            ids: list[int] = self._encode_batch_fast([text], add_special_tokens=False)[0].ids
            return ids  # ``ids`` makes a new list on each read: not copied again
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=False))

    def tokenize_chat(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
    ) -> list[int]:
        """``apply_chat_template(..., tokenize=True)``: the rendered prompt's token ids."""
        text = self.render(messages, tools=tools, add_generation_prompt=add_generation_prompt)
        return self.encode(text)
