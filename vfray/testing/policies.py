"""The scripted model's deterministic policies and its toy tokenizer, independent of wire dialects.

A policy maps a normalized :class:`Conversation` to a :class:`Reply` (text or one tool call); the
wire layer renders that reply in the dialect the request came in.
"""

from __future__ import annotations

import ast
import hashlib
import json
import operator
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

POLICIES = ("echo", "arithmetic", "bash", "tokens", "agent", "user", "judge")
"""Names accepted by ``ScriptedModel(policy=...)``; ``user`` and ``judge`` answer vfray's own
side calls (:mod:`vfray.testing.side_policies`), and are picked per request by their
``x-vfray-role`` header whatever the server's policy."""

VOCAB_SIZE = 1 << 17
_PIECE = re.compile(r"\s*\S+|\s+")


def tokenize(text: str) -> list[str]:
    """Split ``text`` into whitespace-led pieces whose concatenation is exactly ``text``."""
    return _PIECE.findall(text)


def _digest(*parts: object) -> int:
    data = "\x00".join(str(part) for part in parts).encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def token_id(piece: str) -> int:
    """A stable id for one toy token (same piece, same id, across processes and runs)."""
    return _digest("tok", piece) % VOCAB_SIZE


def token_logprob(piece: str, position: int) -> float:
    """A stable, plausible log-probability in (-4, 0] for the piece generated at ``position``."""
    return -round((_digest("lp", piece, position) % 4000) / 1000.0, 3)


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

    @property
    def completion_tokens(self) -> int:
        return len(self.pieces)


# -- arithmetic ------------------------------------------------------------------------------

_WORDS = (
    (r"\bmultiplied\s+by\b", "*"),
    (r"\bdivided\s+by\b", "/"),
    (r"\btimes\b", "*"),
    (r"\bplus\b", "+"),
    (r"\bminus\b", "-"),
    (r"(?<=\d)\s*[x\u00d7]\s*(?=[-\d(])", " * "),  # x and the multiplication sign
    (r"\u00f7", "/"),
    (r"\u2212", "-"),  # the minus sign
)
_CANDIDATE = re.compile(r"[-(\d][-+*/()\d\s.]*[\d)]")
_OPS: dict[type[ast.AST], Callable[[Fraction, Fraction], Fraction]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


def _evaluate(node: ast.AST) -> Fraction:
    # A whitelist evaluator: only integer literals and + - * / (never eval()).
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    raise ValueError("not plain arithmetic")


def solve(question: str) -> Fraction | None:
    """The value of the first arithmetic expression in ``question`` ("What is 12 + 30?")."""
    text = question
    for pattern, symbol in _WORDS:
        text = re.sub(pattern, symbol, text, flags=re.IGNORECASE)
    for match in _CANDIDATE.finditer(text):
        candidate = match.group().strip()
        try:
            tree = ast.parse(candidate, mode="eval")
        except SyntaxError:
            continue
        if not any(isinstance(node, ast.BinOp) for node in ast.walk(tree)):
            continue
        try:
            return _evaluate(tree)
        except (ValueError, ZeroDivisionError):
            continue
    return None


def format_number(value: Fraction) -> str:
    if value.denominator == 1:
        return str(value.numerator)
    return f"{float(value):.6g}"


# -- bash ------------------------------------------------------------------------------------

_FENCE = re.compile(r"```(?:[a-z]*\n)?(.*?)```", re.DOTALL)
_TICKS = re.compile(r"`([^`\n]+)`")
_RUN = re.compile(r"\brun:\s*(.+)", re.IGNORECASE)


def find_command(prompt: str) -> str | None:
    """The shell command a prompt asks for: a fenced block, text in backticks, or after 'run:'."""
    for pattern in (_FENCE, _TICKS, _RUN):
        match = pattern.search(prompt)
        if match and match.group(1).strip():
            return match.group(1).strip()
    return None


# -- the policies ----------------------------------------------------------------------------


class Sampler:
    """Seeded randomness for the policies: rollouts of one prompt differ, reruns repeat.

    The nonce of a call is the request's integer ``seed`` field when it has one, else how many
    calls with the same prompt this server has answered before. So the k-th rollout of a task
    gets the same answer on every run with the same ``seed``, and the n rollouts of one task get
    a spread of answers.
    """

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._seen: dict[str, int] = {}

    def rng(self, prompt: str, request_seed: int | None) -> random.Random:
        if request_seed is not None:
            nonce = f"s{request_seed}"
        else:
            count = self._seen.get(prompt, 0)
            self._seen[prompt] = count + 1
            nonce = f"k{count}"
        return random.Random(_digest("rng", self.seed, prompt, nonce))


@dataclass(frozen=True)
class Decision:
    text: str = ""
    tool_call: tuple[str, dict[str, object]] | None = None


def decide(policy: str, conv: Conversation, accuracy: float, sampler: Sampler) -> Decision:
    """What ``policy`` answers to ``conv`` (before tokenization and ``max_tokens``)."""
    if policy in ("echo", "tokens"):
        return Decision(text=conv.last_user)
    if policy == "arithmetic":
        value = solve(conv.last_user)
        if value is None:
            return Decision(text="I can only answer arithmetic questions.")
        rng = sampler.rng(conv.last_user, conv.seed)
        if rng.random() >= accuracy:
            value += rng.randint(1, 9) * rng.choice((-1, 1))
        return Decision(text=format_number(value))
    if policy == "bash":
        if conv.tool_output is not None:
            return Decision(text=conv.tool_output)
        command = find_command(conv.last_user)
        if command is None:
            return Decision(text="I found no command to run.")
        if "bash" not in conv.tool_names:
            return Decision(text=command)
        return Decision(tool_call=("bash", {"command": command}))
    if policy == "agent":
        from vfray.testing.agent import decide_agent

        return decide_agent(conv)
    if policy in ("user", "judge"):
        from vfray.testing import side_policies

        return side_policies.decide(policy, conv)
    raise ValueError(f"unknown policy {policy!r}; expected one of {', '.join(POLICIES)}")


def reply(decision: Decision, conv: Conversation, *, policy: str, call_id: str) -> Reply:
    """Tokenize a decision, apply ``max_tokens`` to text answers, and count usage."""
    prompt_pieces = [piece for text in conv.texts for piece in tokenize(text)]
    with_tokens = policy == "tokens" or conv.want_tokens
    tool_call = None
    if decision.tool_call is not None:
        name, args = decision.tool_call
        namespace, _, short = name.rpartition(NAMESPACE_SEP)
        tool_call = ToolCall(
            id=call_id, name=short, arguments=json.dumps(args), namespace=namespace or None
        )
        # Tool calls are never cut at max_tokens: a half JSON object helps no test.
        pieces, text, finish = tokenize(tool_call.arguments), "", "tool_calls"
    else:
        pieces, finish = tokenize(decision.text), "stop"
        if conv.max_tokens is not None and len(pieces) > conv.max_tokens:
            pieces, finish = pieces[: conv.max_tokens], "length"
        text = "".join(pieces)
    return Reply(
        text=text,
        tool_call=tool_call,
        finish=finish,
        pieces=pieces,
        prompt_token_ids=[token_id(piece) for piece in prompt_pieces] if with_tokens else [],
        prompt_tokens=len(prompt_pieces),
        with_tokens=with_tokens,
        token_ids=[token_id(piece) for piece in pieces] if with_tokens else [],
        logprobs=[token_logprob(p, i) for i, p in enumerate(pieces)] if with_tokens else [],
    )
