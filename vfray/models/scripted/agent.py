"""The scripted model's ``agent`` policy: drives real coding-agent programs with no real model.

It reads a short plan from the task prompt (``write "TEXT" to PATH``, ``run: COMMAND``, ``tool:
NAME {"arg": ...}`` for an MCP tool offered under that name or prefixed by its server, ``ask:
QUESTION`` for the recursive ``ask`` tool of the ``rlm`` harness), runs one
step per request through whatever shell tool the request offers (or a fenced code block, for
agents that parse commands out of text), then ends: with the submit command when the agent's
prompt names one (mini-swe-agent's ``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``), else with a
final text answer and no tool call. The server keeps no state: the step is counted from the
conversation the request carries. A compaction request (the ``compact`` harness) is answered
with a summary that says how many steps are done, which the compacted context then counts.
"""

from __future__ import annotations

import json
import re
import shlex
from typing import Any

from vfray.models.scripted.conversation import NAMESPACE_SEP, Conversation, Decision, ShellTool

SHELL_TOOLS = (
    "bash",
    "Bash",
    "exec_command",
    "shell",
    "run_shell_command",
    "execute_command",
    "terminal",
    "exec",
)
"""Tool names taken for a shell, most preferred first (Codex offers both ``exec_command`` and,
in some versions, ``shell``; OpenClaw's is ``exec``)."""
_ARGUMENTS = ("command", "cmd", "script")

SUBMIT_COMMAND = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
"""mini-swe-agent ends when a command's output starts with this marker."""
_SUBMIT_MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
SWE_AGENT_SUBMIT = "```bash\nsubmit\n```"
"""SWE-agent's ``bash_only`` prompt shows its submit command so; a step without a bash block
is rejected as a format error and asked again, so the plan ends with ``submit``."""
_TOOL_STEP = "\x00tool\x00"
"""Marks a plan step that calls a tool by name (``tool: NAME {json}``) instead of a shell."""
_TEXT_FENCE = "mswea_bash_command"
COMPACT_REQUEST = "Summarise the conversation so far for a fresh context"
"""How the chat loop's compaction request opens (``programs/chat_loop.py``, which runs in the
box and imports nothing of vfray, says it too)."""
_STEPS_DONE = re.compile(r"\[steps done: (\d+)\]")
"""The fence language mini-swe-agent's text-based config parses (``mini_textbased.yaml``)."""

_STEP = re.compile(
    r"""\bwrite\s+(?P<q>["'])(?P<text>.*?)(?P=q)\s+(?:to|into)\s+(?:the\s+file\s+)?"""
    r"""`?(?P<path>[\w./~-]*\w)`?"""
    r"""|\brun:[ \t]*(?P<run>[^\n]+)"""
    r"""|\btool:[ \t]*(?P<tool>[\w.-]+)[ \t]*(?P<args>\{[^\n]*\})?"""
    r"""|\bask:[ \t]*(?P<ask>[^\n]+)""",
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
            if match.group("ask"):
                question = json.dumps({"question": match.group("ask").strip()})
                steps.append(f"{_TOOL_STEP}ask{_TOOL_STEP}{question}")
            elif match.group("tool"):
                steps.append(
                    f"{_TOOL_STEP}{match.group('tool')}{_TOOL_STEP}{match.group('args') or '{}'}"
                )
            elif match.group("run"):
                steps.append(match.group("run").strip().strip("`"))
            else:
                steps.append(write_command(match.group("path"), match.group("text")))
                steps.append(f"cat {shlex.quote(match.group('path'))}")
        if steps:
            before = conv.user_actions[index] if index < len(conv.user_actions) else 0
            # A compacted context carries the steps done before it in its summary.
            done = [int(m) for t in conv.user_texts[index + 1 :] for m in _STEPS_DONE.findall(t)]
            return steps, conv.actions_taken - before + (done[-1] if done else 0)
    return [], conv.actions_taken


def write_command(path: str, text: str) -> str:
    """The shell command of a ``write "TEXT" to PATH`` step: the line TEXT into PATH."""
    return f"printf '%s\\n' {shlex.quote(text)} > {shlex.quote(path)}"


def find_shell(tools: list[dict[str, Any]]) -> ShellTool | None:
    """The preferred shell tool among ``tools`` (any dialect's schemas), with its argument name
    read from the schema's properties. A tool served over MCP counts under its own name
    (``mcp__acp__Bash`` is a ``Bash``: Claude Code's ACP adapter offers its shell so), after an
    unprefixed one."""
    found: dict[str, tuple[str, dict[str, Any]]] = {}
    for tool in tools:
        function = tool.get("function")
        spec = function if isinstance(function, dict) else tool
        name = spec.get("name")
        if not isinstance(name, str):
            continue
        base = name.rsplit("__", 1)[-1] if name.startswith("mcp__") else name
        if base in SHELL_TOOLS and (base not in found or base == name):
            schema = spec.get("parameters") or spec.get("input_schema") or {}
            found[base] = (name, schema if isinstance(schema, dict) else {})
    for base in SHELL_TOOLS:
        if base in found:
            name, schema = found[base]
            properties = schema.get("properties") or {}
            argument = next((a for a in _ARGUMENTS if a in properties), None)
            if argument is None:
                required = schema.get("required") or []
                argument = required[0] if required else "command"
            kind = properties.get(argument, {}) if isinstance(properties, dict) else {}
            extra = _required_defaults(schema, argument)
            return ShellTool(name, argument, argv=kind.get("type") == "array", extra=extra)
    return None


def _required_defaults(schema: dict[str, Any], argument: str) -> tuple[tuple[str, Any], ...]:
    """A plain value for each other required argument: numbers are timeouts in the shells seen
    (milliseconds in Claude Code's ACP ``Bash``), so a minute's worth, within any maximum."""
    properties = schema.get("properties") or {}
    values: list[tuple[str, Any]] = []
    for name in schema.get("required") or []:
        spec = properties.get(name) if isinstance(properties, dict) else None
        if name == argument or not isinstance(spec, dict):
            continue
        kind = spec.get("type")
        if kind in ("number", "integer"):
            maximum = spec.get("maximum")
            values.append((name, 60000 if maximum is None else min(60000, maximum)))
        elif kind == "boolean":
            values.append((name, False))
        elif kind == "string":
            values.append((name, "a step of the plan"))
    return tuple(values)


def decide_agent(conv: Conversation) -> Decision:
    """The next action of the plan, then the submit command or the final answer."""
    steps, taken = _newest_plan(conv)
    if conv.tool_output is None and conv.last_user.startswith(COMPACT_REQUEST):
        return Decision(text=f"Working through the task's plan. [steps done: {taken}]")
    if any(_SUBMIT_MARKER in text for text in conv.texts):
        steps = [*steps, SUBMIT_COMMAND]
    elif any(SWE_AGENT_SUBMIT in text for text in conv.texts):
        steps = [*steps, "submit"]
    if taken < len(steps):
        return _act(conv, steps[taken])
    if not steps:
        return Decision(text="There is nothing to do: the task names no step I can take.")
    last = (conv.tool_output or "").strip()
    return Decision(text=f"Done. {last}" if last else "Done.")


def find_tool(conv: Conversation, name: str) -> str | None:
    """The offered tool called ``name``: exactly, or as an MCP tool an agent prefixed with its
    server (Claude Code's ``mcp__server__name``; Codex offers them in a Responses namespace;
    opencode's ``server_name``)."""
    if name in conv.tool_names:
        return name
    matches = sorted(
        t for t in conv.tool_names if t.endswith((f"__{name}", f"{NAMESPACE_SEP}{name}"))
    )
    # opencode joins server and tool with one underscore (``scratchpad_read_note``).
    matches = matches or sorted(t for t in conv.tool_names if t.endswith(f"_{name}"))
    return matches[0] if matches else None


def _act(conv: Conversation, command: str) -> Decision:
    if command.startswith(_TOOL_STEP):
        _, name, raw = command.split(_TOOL_STEP, 2)
        offered = find_tool(conv, name)
        if offered is None:
            return Decision(text=f"I cannot call {name}: no such tool is offered.")
        try:
            args = json.loads(raw)
        except ValueError:
            args = {}
        return Decision(tool_call=(offered, args if isinstance(args, dict) else {}))
    shell = conv.shell
    if shell is None:
        fence = _TEXT_FENCE if any(_TEXT_FENCE in text for text in conv.texts) else "bash"
        return Decision(text=f"Running the next step.\n\n```{fence}\n{command}\n```")
    value: object = ["bash", "-lc", command] if shell.argv else command
    return Decision(tool_call=(shell.name, {**dict(shell.extra), shell.argument: value}))
