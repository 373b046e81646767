"""The scripted model's deterministic policies and its toy tokenizer, independent of wire dialects.

A policy maps a normalized :class:`Conversation` to a :class:`Reply` (text or one tool call); the
wire layer renders that reply in the dialect the request came in.
"""

from __future__ import annotations

import ast
import base64
import hashlib
import json
import operator
import random
import re
from collections.abc import Callable
from fractions import Fraction

from vfray.models.scripted import agent, aider, browser, side_policies, terminus
from vfray.models.scripted.conversation import (
    NAMESPACE_SEP,
    Conversation,
    Decision,
    Reply,
    ToolCall,
    digest,
    token_id,
    token_logprob,
    tokenize,
)

POLICIES = ("echo", "arithmetic", "bash", "tokens", "agent", "user", "judge", "images")
"""Names accepted by ``ScriptedModel(policy=...)``; ``images`` names each image of the last user
message (:func:`describe_images`: what a test of image input asserts); ``user`` and ``judge``
answer vfray's own
side calls (:mod:`vfray.models.scripted.side_policies`), and are picked per request by their
``x-vfray-role`` header whatever the server's policy."""

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
    """The shell command a prompt asks for: a fenced block, text in backticks, after 'run:', or
    the write of ``write "TEXT" to PATH`` (the ``agent`` policy's plan step, so one prompt
    drives the chat loops and the real agents alike)."""
    for pattern in (_FENCE, _TICKS, _RUN):
        match = pattern.search(prompt)
        if match and match.group(1).strip():
            return match.group(1).strip()
    for match in agent._STEP.finditer(prompt):
        if match.group("path"):
            return agent.write_command(match.group("path"), match.group("text"))
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
        return random.Random(digest("rng", self.seed, prompt, nonce))


def describe_images(images: tuple[str, ...]) -> str:
    """One line per image: an inline one as its media type, size and the SHA-256 of its bytes
    (first 12 hex digits), a remote one as its URL."""
    lines = []
    for i, url in enumerate(images, 1):
        head, sep, data = url.partition(";base64,")
        try:
            raw = base64.b64decode(data, validate=True) if url.startswith("data:") and sep else None
        except ValueError:
            raw = None
        if raw is not None:
            digest_ = hashlib.sha256(raw).hexdigest()[:12]
            lines.append(f"image {i}: {head[5:]}, {len(raw)} bytes, sha256 {digest_}")
        else:
            lines.append(f"image {i}: {url}")
    return "\n".join(lines) or "I see no image."


def decide(policy: str, conv: Conversation, accuracy: float, sampler: Sampler) -> Decision:
    """What ``policy`` answers to ``conv`` (before tokenization and ``max_tokens``)."""
    if policy in ("echo", "tokens"):
        return Decision(text=conv.last_user)
    if policy == "images":
        return Decision(text=describe_images(conv.images))
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
        if terminus.is_terminus(conv):
            return terminus.decide(conv)
        if browser.is_browser_use(conv):
            return browser.decide_browser(conv)
        if aider.is_aider(conv):
            return aider.decide(conv)
        return agent.decide_agent(conv)
    if policy in ("user", "judge"):
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
