"""v1's scoring helpers (``verifiers.v1.utils.score``, also on ``verifiers.v1``): the last
``\\boxed{...}`` of a reply, a judge's verdict among fixed choices, boxed math answers checked
with math-verify, program output compared loosely, pytest's outcome lines, and an answer read
from a file in the box or else the last reply."""

from __future__ import annotations

import re
from collections.abc import Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

from vfray.errors import ConfigError, SandboxError

_BOXED = "\\boxed{"
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")
_OUTCOMES = ("PASSED", "FAILED", "ERROR", "SKIPPED", "XFAIL", "XPASS")
_VERDICT = re.compile(
    r"(?:^|\n)\s*(?:FINAL\s+JUDGMENT|FINAL\s+ANSWER|FINAL\s+VERDICT|JUDGMENT|VERDICT|ANSWER)"
    r"\s*(?:IS\s*)?[:\-]?\s*"
)


def extract_boxed_answer(text: str, strict: bool = False) -> str:
    """The contents of the last ``\\boxed{...}`` (nested braces counted); without one, or
    unclosed, ``text`` itself (``""`` when ``strict``)."""
    start = text.rfind(_BOXED)
    if start != -1:
        depth, first = 0, start + len(_BOXED)
        for at in range(first, len(text)):
            depth += {"{": 1, "}": -1}.get(text[at], 0)
            if depth < 0:
                return text[first:at]
    return "" if strict else text


def _after_thinking(text: str | None) -> str | None:
    """The text after a closed ``</think>``; None for nothing, or thinking left unclosed."""
    if not text or ("<think>" in text and "</think>" not in text):
        return None
    return text.rsplit("</think>", 1)[-1]


def parse_judge_choice(content: str | None, choices: Sequence[str] = ("A", "B", "C")) -> str | None:
    """The choice a judge's reply settles on (case-insensitive, as spelled in ``choices``): the
    first after a ``VERDICT:``-style line, else the last one named; None if none is."""
    text = _after_thinking(content)
    if text is None:
        return None
    text = text.strip()
    text = extract_boxed_answer(text, strict=True).strip() or text
    upper = text.upper()
    spelled = {c.upper(): c for c in choices}
    named = re.compile(rf"(?<!\w)({'|'.join(re.escape(c) for c in spelled)})(?!\w)")
    verdict = _VERDICT.search(upper)
    if verdict:
        found = named.search(upper[verdict.end() :])  # sliced: nothing before it is seen
        return spelled[found.group(1)] if found else None
    hits = named.findall(upper)
    return spelled[hits[-1]] if hits else None


def verify_boxed_math_answer(
    response: str | None, answer: str, *, timeout_seconds: int = 5
) -> float:
    """1.0 when the reply's last boxed answer equals ``answer`` as math (math-verify), else 0.0."""
    try:
        from math_verify import parse, verify  # type: ignore[import-not-found]
    except ImportError:
        raise ConfigError(
            "verifiers.v1.verify_boxed_math_answer needs math-verify (pip install math-verify)"
        ) from None
    text = _after_thinking(response)
    if text is None:
        return 0.0
    guess = extract_boxed_answer(text, strict=True).strip()
    gold = (extract_boxed_answer(answer, strict=True) or answer).strip()
    if not guess or not gold:
        return 0.0
    try:
        parsed = [parse(f"\\boxed{{{s}}}", parsing_timeout=timeout_seconds) for s in (gold, guess)]
        return float(verify(*parsed, timeout_seconds=timeout_seconds))
    except Exception:  # a malformed answer scores 0, as in v1 (math-verify's timeout included)
        return 0.0


def compare_stdout_results(exec_stdout: str, expected: str, *, tolerance: float = 1e-3) -> bool:
    """Whether a program's output matches: exactly, line by line or token by token stripped, or
    as numbers within ``tolerance``."""
    if exec_stdout.strip() == expected.strip():
        return True
    lines = [[ln.strip() for ln in s.splitlines() if ln.strip()] for s in (exec_stdout, expected)]
    if lines[0] == lines[1]:
        return True
    got, want = ([t for ln in side for t in ln.split()] for side in lines)
    if got == want:
        return True
    if len(got) != len(want) or not got:
        return False
    try:
        numbers = [(Decimal(a), Decimal(b)) for a, b in zip(got, want, strict=True)]
    except (InvalidOperation, ValueError):
        return False
    if not all(a.is_finite() and b.is_finite() for a, b in numbers):
        return False
    limit = Decimal(str(tolerance))
    return all(abs(a - b) <= limit for a, b in numbers)


def parse_pytest_outcomes(output: str | None) -> dict[str, str]:
    """Test node id → outcome (``PASSED``, ``FAILED``, ...) from pytest's ``-rA``/``-v`` lines."""
    outcomes: dict[str, str] = {}
    for line in _ANSI.sub("", output or "").splitlines():
        parts = line.strip().split(maxsplit=1)
        if len(parts) != 2 or parts[0] not in _OUTCOMES or parts[1].startswith("["):
            continue  # not an outcome line, or a SKIPPED summary row ("[N] file:line: reason")
        outcome, test_id = parts
        if outcome in ("FAILED", "ERROR", "XFAIL", "XPASS") and " - " in test_id:
            # A summary row appends " - <reason>"; the node id is the shortest balanced prefix.
            pieces = test_id.split(" - ")
            for cut in range(1, len(pieces)):
                node = " - ".join(pieces[:cut])
                if node.count("[") == node.count("]"):
                    test_id = node
                    break
        outcomes[test_id.rstrip()] = outcome
    return outcomes


async def read_answer_file_or_last_reply(runtime: Any, path: str, trace: Any) -> str:
    """The stripped text of ``path`` in the box; the last reply when it is missing or empty."""
    try:
        answer = (await runtime.read(path)).decode(errors="replace").strip()
    except (OSError, SandboxError):
        answer = ""
    return answer or str(trace.last_reply or "")
