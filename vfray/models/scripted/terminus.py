"""The scripted ``agent`` policy's answers to terminus-2 (terminal-bench's reference agent, JSON
format): each reply is the JSON object its prompt asks for, one plan step a reply as keystrokes
(the command and a newline), then ``"task_complete": true`` (which terminus-2 asks to confirm:
the same answer confirms it). The plan is the task description's (``write "TEXT" to PATH``,
``run: COMMAND``: :func:`vfray.models.scripted.agent.plan`), read from the first prompt only, as
the terminal output that follows may echo anything; the steps done are counted from the
assistant's earlier replies that sent keystrokes.
"""

from __future__ import annotations

import dataclasses
import json

from vfray.models.scripted import agent
from vfray.models.scripted.conversation import Conversation, Decision

TASK = "Task Description:\n"
SCREEN = "\n\nCurrent terminal state:"
DURATION = 0.2
"""Seconds each step's keystrokes wait: the plan's commands are quick ones."""


def is_terminus(conv: Conversation) -> bool:
    """The conversation is terminus-2's: its first user message is the JSON-format prompt."""
    first = conv.user_texts[0] if conv.user_texts else ""
    return TASK in first and SCREEN in first and '"keystrokes"' in first


def task_text(conv: Conversation) -> str:
    first = conv.user_texts[0]
    return first[first.index(TASK) + len(TASK) : first.rindex(SCREEN)]


def _sent_keys(text: str) -> bool:
    try:
        data = json.loads(text)
    except ValueError:
        return False
    return isinstance(data, dict) and bool(data.get("commands"))


def decide(conv: Conversation) -> Decision:
    """The next step as keystrokes, then the task marked complete."""
    task = dataclasses.replace(conv, user_texts=(task_text(conv),), user_actions=(0,))
    # Shell steps only: terminus-2 offers no tools to call (the plan marks a tool step with a
    # leading NUL, which no shell command has).
    steps = [s for s in agent.plan(task) if not s.startswith("\x00")]
    done = sum(_sent_keys(text) for text in conv.assistant_texts)
    if done < len(steps):
        answer = {
            "analysis": f"Step {done + 1} of {len(steps)} of the task's plan is next.",
            "plan": f"Run: {steps[done]}",
            "commands": [{"keystrokes": f"{steps[done]}\n", "duration": DURATION}],
            "task_complete": False,
        }
    else:
        answer = {
            "analysis": "Every step of the plan has run." if steps else "The task names no step.",
            "plan": "Mark the task complete.",
            "commands": [],
            "task_complete": True,
        }
    return Decision(text=json.dumps(answer, indent=2))
