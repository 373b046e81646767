"""The scripted model as a simulated user and as a judge: deterministic answers to vfray's own
side calls (picked per request by their ``x-vfray-role`` header, see :mod:`.scripted`).

``user``: says the lines of its system prompt that start with ``"> "``, one per turn (the k-th
line once it has spoken k times), then ``###DONE###``.

``judge``: reads the labelled blocks of the prompt (``Response:``, ``Reference answer:``,
``Criteria:``; a block is the fenced text under its label, or the lines up to the next label).
With criteria (``- name: description`` lines) it answers ``{"verdicts": [{"name", "reason",
"verdict"}]}``, ``yes`` for a criterion when every ``"quoted phrase"`` in its description
occurs in the response (case-insensitive). With a reference answer it says the first of the
labels named by ``Respond either "A" or "B"`` (default yes/no) when the reference's words occur
in the response, in order and adjacent, else the second. Otherwise it says it cannot judge.
"""

from __future__ import annotations

import json
import re

from vfray.models.scripted.conversation import Conversation, Decision

DONE = "###DONE###"
_LABEL = re.compile(r"^([A-Z][A-Za-z ]{0,40}):\s*(.*)$")
_LABELS = re.compile(r'Respond either "([^"]+)" or "([^"]+)"')
_QUOTED = re.compile(r'"([^"]+)"')
_WORD = re.compile(r"\w+")
_CRITERION = re.compile(r"^\s*[-*]\s*([^:]+):\s*(.*)$")


def decide(policy: str, conv: Conversation) -> Decision:
    if policy == "user":
        return Decision(text=_user(conv))
    return Decision(text=_judge(conv.system + "\n" + conv.last_user))


def _user(conv: Conversation) -> str:
    script = [line[2:].strip() for line in conv.system.splitlines() if line.startswith("> ")]
    spoken = len(conv.assistant_texts)
    return script[spoken] if spoken < len(script) else DONE


def sections(text: str) -> dict[str, str]:
    """Label → block: the first fenced block under the label, else its inline text and lines."""
    found: dict[str, list[str]] = {}
    fenced: dict[str, list[str]] = {}
    label: str | None = None
    capture: list[str] | None = None
    in_fence = False
    for line in text.splitlines():
        if line.strip().startswith("```"):
            in_fence = not in_fence
            capture = None
            if in_fence and label is not None and label not in fenced:
                capture = fenced[label] = []
            continue
        if in_fence:
            if capture is not None:
                capture.append(line)
            continue
        match = _LABEL.match(line)
        if match:
            label = match.group(1)
            found[label] = [match.group(2)] if match.group(2) else []
        elif label is not None:
            found[label].append(line)
    blocks = {name: "\n".join(lines).strip() for name, lines in found.items()}
    blocks.update({name: "\n".join(lines).strip() for name, lines in fenced.items()})
    return blocks


def _words(text: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(text)]


def _contains(response: str, reference: str) -> bool:
    have, want = _words(response), _words(reference)
    if not want:
        return False
    return any(have[i : i + len(want)] == want for i in range(len(have) - len(want) + 1))


def _judge(prompt: str) -> str:
    blocks = sections(prompt)
    response = blocks.get("Response", "")
    if "Criteria" in blocks:
        verdicts = []
        for line in blocks["Criteria"].splitlines():
            match = _CRITERION.match(line)
            if not match:
                continue
            name, description = match.group(1).strip(), match.group(2)
            phrases = _QUOTED.findall(description)
            ok = all(p.lower() in response.lower() for p in phrases)
            reason = (
                "the response says " + ", ".join(repr(p) for p in phrases)
                if ok
                else ("the response does not say all of " + ", ".join(repr(p) for p in phrases))
            )
            verdicts.append({"name": name, "reason": reason, "verdict": "yes" if ok else "no"})
        return json.dumps({"verdicts": verdicts})
    if "Reference answer" in blocks:
        labels = _LABELS.search(prompt)
        positive, negative = labels.groups() if labels else ("yes", "no")
        return positive if _contains(response, blocks["Reference answer"]) else negative
    return "I cannot judge this."
