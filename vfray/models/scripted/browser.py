"""The scripted ``agent`` policy's answers to browser-use: one action per step in browser-use's
structured output (``AgentOutput`` JSON: ``memory``, ``next_goal``, ``action: [...]``).

The task's plan is read from browser-use's ``<user_request>``: ``open: URL`` (navigate there
unless the current tab already shows it), ``click: LABEL`` (the interactive element whose text
or attributes hold LABEL), ``type: TEXT into LABEL`` and ``answer: REGEX`` (end with ``done``,
its text the first match of REGEX in the page's ``<browser_state>``, group 1 when it has one).
browser-use sends no past assistant turns, only its ``<agent_history>``, where each step's
``memory`` is echoed: the steps done are counted there, as ``[browser steps done: N]``.
"""

from __future__ import annotations

import json
import re
from typing import Any

from vfray.models.scripted.conversation import Conversation, Decision

_REQUEST = re.compile(r"<user_request>\s*(.*?)\s*</user_request>", re.DOTALL)
_STATE = re.compile(r"<browser_state>(.*?)</browser_state>", re.DOTALL)
_DONE = re.compile(r"\[browser steps done: (\d+)\]")
_CURRENT_URL = re.compile(r"^Tab \w+: (\S+)", re.MULTILINE)
_ELEMENT = re.compile(r"\[(\d+)\]<")
_STEP = re.compile(
    r"^\s*(?:"
    r"open:\s*(?P<open>\S+)"
    r"|click:\s*(?P<click>.+?)"
    r"|type:\s*(?P<text>.+?)\s+into\s+(?P<field>.+?)"
    r"|answer:\s*(?P<answer>.+?)"
    r")\s*$",
    re.IGNORECASE | re.MULTILINE,
)


def is_browser_use(conv: Conversation) -> bool:
    """The request is browser-use's agent step (its user message carries the page state)."""
    return "<user_request>" in conv.last_user and "<browser_state>" in conv.last_user


def plan(request: str) -> list[tuple[str, str, str]]:
    """The plan's steps as (kind, argument, second argument)."""
    steps = []
    for m in _STEP.finditer(request):
        if m.group("open"):
            steps.append(("open", m.group("open"), ""))
        elif m.group("click"):
            steps.append(("click", m.group("click"), ""))
        elif m.group("text"):
            steps.append(("type", m.group("text").strip("\"'"), m.group("field")))
        else:
            steps.append(("answer", m.group("answer"), ""))
    return steps


def find_element(state: str, label: str) -> int | None:
    """The index of the interactive element whose chunk of the page state mentions ``label``
    (case-insensitive): its tag, attributes or text up to the next element."""
    starts = list(_ELEMENT.finditer(state))
    for i, m in enumerate(starts):
        end = starts[i + 1].start() if i + 1 < len(starts) else len(state)
        if label.lower() in state[m.start() : end].lower():
            return int(m.group(1))
    return None


def decide_browser(conv: Conversation) -> Decision:
    """The next step of the plan, as browser-use's ``AgentOutput`` JSON text."""
    request = _REQUEST.search(conv.last_user)
    state_match = _STATE.search(conv.last_user)
    state = state_match.group(1) if state_match else ""
    steps = plan(request.group(1) if request else "")
    done = max((int(n) for n in _DONE.findall(conv.last_user)), default=0)
    current = _CURRENT_URL.search(state)
    while done < len(steps):
        kind, arg, second = steps[done]
        if kind == "open":
            if current is not None and current.group(1).rstrip("/") == arg.rstrip("/"):
                done += 1  # browser-use opened the task's URL before the first step
                continue
            return _output(done + 1, f"open {arg}", {"navigate": {"url": arg, "new_tab": False}})
        if kind in ("click", "type"):
            target = arg if kind == "click" else second
            index = find_element(state, target)
            if index is None:
                return _output(done, f"find {target!r}", _done(f"no element {target!r}", False))
            action: dict[str, Any] = (
                {"click": {"index": index}}
                if kind == "click"
                else {"input": {"index": index, "text": arg, "clear": True}}
            )
            return _output(done + 1, f"{kind} {target}", action)
        match = re.search(arg, state)
        if match is None:
            return _output(done, "answer", _done(f"no match for {arg!r} on the page", False))
        found = match.group(1) if match.groups() else match.group(0)
        return _output(done + 1, "answer", _done(found, True))
    return _output(done, "finish", _done("Done.", True))


def _done(text: str, success: bool) -> dict[str, Any]:
    return {"done": {"text": text, "success": success, "files_to_display": []}}


def _output(steps_done: int, goal: str, action: dict[str, Any]) -> Decision:
    body = {
        "thinking": None,
        "evaluation_previous_goal": "Following the task's plan.",
        "memory": f"[browser steps done: {steps_done}]",
        "next_goal": goal,
        "current_plan_item": None,
        "plan_update": None,
        "action": [action],
    }
    return Decision(text=json.dumps(body))
