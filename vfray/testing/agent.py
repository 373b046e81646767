"""The scripted model's ``agent`` policy: drives real coding-agent programs with no real model.

It reads a short plan from the task prompt (``write "TEXT" to PATH``, ``run: COMMAND``), runs one
step per request through whatever shell tool the request offers (or a fenced code block, for
agents that parse commands out of text), then ends: with the submit command when the agent's
prompt names one (mini-swe-agent's ``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``), else with a
final text answer and no tool call. The server keeps no state: the step is counted from the
conversation the request carries.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from vfray.testing.policies import Conversation, Decision, ShellTool

SHELL_TOOLS = (
    "bash",
    "Bash",
    "exec_command",
    "shell",
    "run_shell_command",
    "execute_command",
    "terminal",
)
"""Tool names taken for a shell, most preferred first (Codex offers both ``exec_command`` and,
in some versions, ``shell``)."""
_ARGUMENTS = ("command", "cmd", "script")

SUBMIT_COMMAND = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
"""mini-swe-agent ends when a command's output starts with this marker."""
_SUBMIT_MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
_TEXT_FENCE = "mswea_bash_command"
"""The fence language mini-swe-agent's text-based config parses (``mini_textbased.yaml``)."""

_STEP = re.compile(
    r"""\bwrite\s+(?P<q>["'])(?P<text>.*?)(?P=q)\s+(?:to|into)\s+(?:the\s+file\s+)?"""
    r"""`?(?P<path>[\w./~-]*\w)`?"""
    r"""|\brun:[ \t]*(?P<run>[^\n]+)""",
    re.IGNORECASE | re.DOTALL,
)


def plan(conv: Conversation) -> list[str]:
    """The shell commands the task asks for, from the newest user message that names any:
    ``write "TEXT" to PATH`` becomes a write then a ``cat`` that checks it; ``run: COMMAND``
    (to the end of its line) runs as given."""
    return _newest_plan(conv)[0]


def _newest_plan(conv: Conversation) -> tuple[list[str], int]:
    """:func:`plan`, and how many actions the assistant took since the message that named it
    (a later user turn, in a resumed session, starts a plan of its own)."""
    for index in range(len(conv.user_texts) - 1, -1, -1):
        text = conv.user_texts[index]
        steps: list[str] = []
        for match in _STEP.finditer(text):
            if match.group("run"):
                steps.append(match.group("run").strip().strip("`"))
            else:
                path = shlex.quote(match.group("path"))
                steps.append(f"printf '%s\\n' {shlex.quote(match.group('text'))} > {path}")
                steps.append(f"cat {path}")
        if steps:
            before = conv.user_actions[index] if index < len(conv.user_actions) else 0
            return steps, conv.actions_taken - before
    return [], conv.actions_taken


def find_shell(tools: list[dict[str, Any]]) -> ShellTool | None:
    """The preferred shell tool among ``tools`` (any dialect's schemas), with its argument name
    read from the schema's properties."""
    found: dict[str, dict[str, Any]] = {}
    for tool in tools:
        function = tool.get("function")
        spec = function if isinstance(function, dict) else tool
        name = spec.get("name")
        if isinstance(name, str) and name in SHELL_TOOLS:
            schema = spec.get("parameters") or spec.get("input_schema") or {}
            found[name] = schema if isinstance(schema, dict) else {}
    for name in SHELL_TOOLS:
        if name in found:
            properties = found[name].get("properties") or {}
            argument = next((a for a in _ARGUMENTS if a in properties), None)
            if argument is None:
                required = found[name].get("required") or []
                argument = required[0] if required else "command"
            kind = properties.get(argument, {}) if isinstance(properties, dict) else {}
            return ShellTool(name, argument, argv=kind.get("type") == "array")
    return None


def decide_agent(conv: Conversation) -> Decision:
    """The next action of the plan, then the submit command or the final answer."""
    steps, taken = _newest_plan(conv)
    submits = any(_SUBMIT_MARKER in text for text in conv.texts)
    if submits:
        steps = [*steps, SUBMIT_COMMAND]
    if taken < len(steps):
        return _act(conv, steps[taken])
    if not steps:
        return Decision(text="There is nothing to do: the task names no step I can take.")
    last = (conv.tool_output or "").strip()
    return Decision(text=f"Done. {last}" if last else "Done.")


def _act(conv: Conversation, command: str) -> Decision:
    shell = conv.shell
    if shell is None:
        fence = _TEXT_FENCE if any(_TEXT_FENCE in text for text in conv.texts) else "bash"
        return Decision(text=f"Running the next step.\n\n```{fence}\n{command}\n```")
    value: object = ["bash", "-lc", command] if shell.argv else command
    return Decision(tool_call=(shell.name, {shell.argument: value}))
