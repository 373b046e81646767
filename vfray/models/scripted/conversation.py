"""What the scripted model's policies read and answer: the normalized :class:`Conversation`, the
toy tokenizer, and the :class:`Decision` and :class:`Reply` a policy produces."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

VOCAB_SIZE = 1 << 17
_PIECE = re.compile(r"\s*\S+|\s+")


def tokenize(text: str) -> list[str]:
    """Split ``text`` into whitespace-led pieces whose concatenation is exactly ``text``."""
    return _PIECE.findall(text)


def digest(*parts: object) -> int:
    data = "\x00".join(str(part) for part in parts).encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def token_id(piece: str) -> int:
    """A stable id for one toy token (same piece, same id, across processes and runs)."""
    return digest("tok", piece) % VOCAB_SIZE


def token_logprob(piece: str, position: int) -> float:
    """A stable, plausible log-probability in (-4, 0] for the piece generated at ``position``."""
    return -round((digest("lp", piece, position) % 4000) / 1000.0, 3)


def count_tokens(texts: list[str]) -> int:
    return sum(len(tokenize(text)) for text in texts)


@dataclass(frozen=True)
class Conversation:
    """One request, reduced to what the policies and the usage counts need."""

    texts: tuple[str, ...]
    """Every text the request carries (system prompt, all messages, tool outputs): the prompt."""
    last_user: str
    """Text of the last user message ('' when there is none)."""
    tool_names: frozenset[str]
    """Names of the tools the request offers."""
    tool_output: str | None
    """The tool result's text when the last message is a tool result, else None."""
    max_tokens: int | None = None
    seed: int | None = None
    """An integer ``seed`` field in the request body, used as the sampling nonce when present."""
    want_tokens: bool = False
    """The request asked for logprobs / token ids (the ``tokens`` policy always returns them)."""
    user_texts: tuple[str, ...] = ()
    """Texts of every user message, oldest first (tool results excluded)."""
    user_actions: tuple[int, ...] = ()
    """For each of ``user_texts``, how many actions the assistant had taken before it."""
    shell: ShellTool | None = None
    """The shell-like tool the request offers, read from its schemas (the ``agent`` policy)."""
    actions_taken: int = 0
    """Actions the assistant already took in this conversation: tool calls, and replies
    carrying a fenced code block (agents that parse commands out of text)."""
    system: str = ""
    """The system (and developer) messages' text (chat requests)."""
    assistant_texts: tuple[str, ...] = ()
    """Texts of the assistant messages, oldest first (chat requests)."""
    images: tuple[str, ...] = ()
    """The image URLs of the last user message, in order (an inline image as a data URL), read
    from each dialect's parts: chat ``image_url``, Responses ``input_image``, Anthropic
    ``image`` blocks."""


@dataclass(frozen=True)
class ShellTool:
    """A tool that runs a shell command: its name, argument name and whether the argument is
    an argv list (``["bash", "-lc", cmd]``) rather than a command string."""

    name: str
    argument: str = "command"
    argv: bool = False
    extra: tuple[tuple[str, Any], ...] = ()
    """Values for the schema's other required arguments (e.g. a ``timeout``)."""


NAMESPACE_SEP = "::"
"""Joins a Responses tool namespace and a tool in it, in ``Conversation.tool_names``."""


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str
    """The arguments as a JSON object text, as the OpenAI dialects carry them."""
    namespace: str | None = None
    """The Responses namespace the tool was offered in (``name`` is then its own name)."""


@dataclass(frozen=True)
class Reply:
    """What the model answers, plus token-level detail and usage for the wire layer."""

    text: str
    tool_call: ToolCall | None
    finish: str
    """``stop``, ``length`` (cut at ``max_tokens``) or ``tool_calls``."""
    pieces: list[str]
    """The generated toy tokens (of the text, or of the tool call's arguments)."""
    prompt_token_ids: list[int]
    prompt_tokens: int
    with_tokens: bool
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    reasoning: str = ""
    """Reasoning sampled before the answer (``reasoning_content``; a chat template's model)."""

    @property
    def completion_tokens(self) -> int:
        return len(self.pieces)


@dataclass(frozen=True)
class Decision:
    text: str = ""
    tool_call: tuple[str, dict[str, object]] | None = None
