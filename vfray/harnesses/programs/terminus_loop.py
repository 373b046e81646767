#!/usr/bin/env python3
"""vfray's terminus-2: the terminal-bench reference agent, stdlib only, run inside the box.

It follows Harbor's ``Terminus2`` (JSON parser, ``terminus-json-plain`` prompt): a tmux session
runs ``bash --login``; the model gets the task and the terminal screen and answers with JSON
(``analysis``, ``plan``, ``commands`` as keystrokes with durations, ``task_complete``); the
keystrokes go to the pane with ``tmux send-keys``, each followed by its duration, and the new
output (or the screen) goes back as the next user message, cut to 10,000 bytes. A first
``task_complete`` is asked to be confirmed, a second one ends the run. Its model calls go to
``$VFRAY_BASE_URL`` (the interception) with the rollout secret; it prints one JSON summary line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from typing import Any

# The program's HTTP client, key handling and ready signal are the chat loop's (uploaded
# beside this file): one copy of each in the tree.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chat_loop import (  # type: ignore[import-not-found]
    Fatal,
    Stopped,
    log,
    post_chat,
    save_transcript,
    signal_ready,
    take_key,
)

PROMPT = """You are an AI assistant tasked with solving command-line tasks in a Linux environment. \
You will be given a task description and the output from previously executed commands. Your goal \
is to solve the task by providing batches of shell commands.

Format your response as JSON with the following structure:

{
  "analysis": "Analyze the current state based on the terminal output provided. What do you \
see? What has been accomplished? What still needs to be done?",
  "plan": "Describe your plan for the next steps. What commands will you run and why? Be \
specific about what you expect each command to accomplish.",
  "commands": [
    {
      "keystrokes": "ls -la\\n",
      "duration": 0.1
    },
    {
      "keystrokes": "cd project\\n",
      "duration": 0.1
    }
  ],
  "task_complete": true
}

Required fields:
- "analysis": Your analysis of the current situation
- "plan": Your plan for the next steps
- "commands": Array of command objects to execute

Optional fields:
- "task_complete": Boolean indicating if the task is complete (defaults to false if not present)

Command object structure:
- "keystrokes": String containing the exact keystrokes to send to the terminal (required)
- "duration": Number of seconds to wait for the command to complete before the next command \
will be executed (defaults to 1.0 if not present)

IMPORTANT: The text inside "keystrokes" will be used completely verbatim as keystrokes. Write \
commands exactly as you want them sent to the terminal:
- You must end every command with a newline (\\n) or it will not execute.
- For special key sequences, use tmux-style escape sequences:
  - C-c for Ctrl+C
  - C-d for Ctrl+D

The "duration" attribute specifies the number of seconds to wait for the command to complete \
(default: 1.0) before the next command will be executed. On immediate tasks (e.g., cd, ls, echo, \
cat) set a duration of 0.1 seconds. On commands (e.g., gcc, find, rustc) set a duration of 1.0 \
seconds. On slow commands (e.g., make, python3 [long running script], wget [file]) set an \
appropriate duration as you determine necessary.

It is better to set a smaller duration than a longer duration. It is always possible to wait \
again if the prior output has not finished, by running {"keystrokes": "", "duration": 10.0} on \
subsequent requests to wait longer. Never wait longer than 60 seconds; prefer to poll to see \
intermediate result status.

Important notes:
- Each command's keystrokes are sent exactly as written to the terminal
- Do not include extra whitespace before or after the keystrokes unless it's part of the \
intended command
- Extra text before or after the JSON will generate warnings but be tolerated
- The JSON must be valid - use proper escaping for quotes and special characters within strings
- Commands array can be empty if you want to wait without taking action

Task Description:
{instruction}

Current terminal state:
{terminal_state}
"""
"""Harbor's ``terminus-json-plain.txt`` template, word for word."""

CONFIRM = (
    "Current terminal state:\n{terminal}\n\n"
    "Are you sure you want to mark the task as complete? "
    "This will trigger your solution to be graded and you won't be able to "
    'make any further corrections. If so, include "task_complete": true '
    "in your JSON response again."
)
MAX_DURATION = 60.0
"""Harbor caps each command's wait at a minute."""


def limit_output(text: str, max_bytes: int) -> str:
    """Harbor's cut: the first and last halves of ``max_bytes``, the middle omitted."""
    raw = text.encode("utf-8")
    if len(raw) <= max_bytes:
        return text
    half = max_bytes // 2
    first = raw[:half].decode("utf-8", errors="ignore")
    last = raw[-half:].decode("utf-8", errors="ignore")
    omitted = len(raw) - len(first.encode()) - len(last.encode())
    return (
        f"{first}\n[... output limited to {max_bytes} bytes; "
        f"{omitted} interior bytes omitted ...]\n{last}"
    )


# -- the reply -----------------------------------------------------------------------------------


def extract_json(text: str) -> tuple[str, list[str]]:
    """The first balanced ``{...}`` object of ``text`` and warnings about text around it."""
    start = end = -1
    depth, in_string, escaped = 0, False, False
    for i, char in enumerate(text):
        if escaped:
            escaped = False
            continue
        if char == "\\":
            escaped = True
            continue
        if char == '"':
            in_string = not in_string
            continue
        if in_string:
            continue
        if char == "{":
            if depth == 0:
                start = i
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0 and start != -1:
                end = i + 1
                break
    if start == -1 or end == -1:
        return "", []
    warnings = []
    if text[:start].strip():
        warnings.append("Extra text detected before JSON object")
    if text[end:].strip():
        warnings.append("Extra text detected after JSON object")
    return text[start:end], warnings


def parse_reply(text: str) -> dict[str, Any]:
    """Harbor's JSON parser, its auto-fix for missing closing braces included: returns
    ``{"commands": [(keys, seconds)], "complete", "error", "warnings"}``."""
    result = _parse(text)
    if result["error"]:
        missing = text.count("{") - text.count("}")
        if missing > 0:
            fixed = _parse(text + "}" * missing)
            if not fixed["error"]:
                fixed["warnings"].insert(
                    0,
                    "AUTO-CORRECTED: Fixed incomplete JSON by adding missing closing brace - "
                    "please fix this in future responses",
                )
                return fixed
    return result


def _parse(text: str) -> dict[str, Any]:
    out: dict[str, Any] = {"commands": [], "complete": False, "error": "", "warnings": []}
    content, out["warnings"] = extract_json(text)
    if not content:
        out["error"] = "No valid JSON found in response"
        return out
    try:
        data = json.loads(content)
    except ValueError as exc:
        out["error"] = f"Invalid JSON: {exc}"
        return out
    if not isinstance(data, dict):
        out["error"] = "Response must be a JSON object"
        return out
    missing = [f for f in ("analysis", "plan", "commands") if f not in data]
    if missing:
        out["error"] = f"Missing required fields: {', '.join(missing)}"
        return out
    commands = data["commands"]
    if not isinstance(commands, list):
        out["error"] = "Field 'commands' must be an array"
        return out
    complete = data.get("task_complete", False)
    out["complete"] = (
        complete.lower() in ("true", "1", "yes") if isinstance(complete, str) else bool(complete)
    )
    for i, command in enumerate(commands, 1):
        if not isinstance(command, dict) or not isinstance(command.get("keystrokes"), str):
            problem = f"Command {i} must be an object with a 'keystrokes' string"
            if out["complete"]:  # a finished task's bad command is only a warning
                out["warnings"].append(problem)
                out["commands"] = []
                return out
            out["error"] = problem
            return out
        duration = command.get("duration", 1.0)
        if not isinstance(duration, (int, float)) or isinstance(duration, bool):
            out["warnings"].append(f"Command {i}: Invalid duration value, using default 1.0")
            duration = 1.0
        out["commands"].append((command["keystrokes"], min(float(duration), MAX_DURATION)))
    return out


# -- the terminal ----------------------------------------------------------------------------


class Terminal:
    """One tmux server and session of its own (its socket under ``/tmp``), ``bash --login``."""

    def __init__(self, tmux: str, width: int, height: int) -> None:
        folder = "/tmp" if os.access("/tmp", os.W_OK) else os.getcwd()
        # A short path: a unix socket's path may hold ~100 bytes.
        self.socket = os.path.join(folder, f"vfray-tmux-{uuid.uuid4().hex[:10]}")
        self.tmux, self.name = tmux, "terminus-2"
        self.previous: str | None = None
        env = {**os.environ, "TERM": "xterm-256color", "SHELL": "/bin/bash"}
        # The rollout secret is for this program, not for the shell the model types into.
        env.pop("VFRAY_API_KEY", None)
        shell = "bash --login" if _which("bash") else "sh -l"
        self.run(
            "new-session", "-d", "-x", str(width), "-y", str(height), "-s", self.name,
            "-c", os.getcwd(), shell, env=env,
        )  # fmt: skip
        self.run("set-option", "-g", "history-limit", "10000000")

    def run(self, *args: str, env: dict[str, str] | None = None) -> str:
        proc = subprocess.run(
            [self.tmux, "-S", self.socket, *args],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            env=env,
            timeout=30,
        )
        if proc.returncode != 0:
            said = proc.stderr.decode("utf-8", "replace").strip()
            raise Fatal(f"tmux {args[0]} failed (exit {proc.returncode}): {said[:500]}")
        return proc.stdout.decode("utf-8", "replace")

    def send(self, keys: str, seconds: float) -> None:
        """The keystrokes verbatim (``C-c`` and the like are tmux key names), then the wait."""
        started = time.monotonic()
        if keys:
            self.run("send-keys", "-t", self.name, "--", keys)
        left = seconds - (time.monotonic() - started)
        if left > 0:
            time.sleep(left)

    def capture(self, entire: bool = False) -> str:
        return self.run("capture-pane", "-p", *(["-S", "-"] if entire else []), "-t", self.name)

    def incremental(self) -> str:
        """Harbor's observation: the output since the last look, else the visible screen."""
        current = self.capture(entire=True)
        previous, self.previous = self.previous, current
        if previous is not None:
            before = previous.strip()
            if before in current:
                at = before.rfind("\n") if "\n" in before else current.index(before)
                new = current[at:]
                if new.strip():
                    return f"New Terminal Output:\n{new}"
        return f"Current Terminal Screen:\n{self.capture()}"

    def close(self) -> None:
        with contextlib.suppress(Exception):
            subprocess.run(
                [self.tmux, "-S", self.socket, "kill-server"],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=10,
            )
        with contextlib.suppress(OSError):
            os.unlink(self.socket)


def _which(name: str) -> bool:
    return any(
        os.access(os.path.join(d, name), os.X_OK)
        for d in os.environ.get("PATH", "/usr/bin:/bin").split(":")
        if d
    )


# -- skills ----------------------------------------------------------------------------------------

_BLOCK_SCALARS = (">", ">-", ">+", "|", "|-", "|+")


def skill_frontmatter(text: str) -> dict[str, str] | None:
    """A SKILL.md's ``name`` and ``description`` from its YAML front matter, or None where it
    has none or lacks either (Harbor skips such a skill). Stdlib only, so the YAML read is the
    subset skills use: ``key: value`` lines, quoted or plain, and ``>`` / ``|`` blocks."""
    match = re.match(r"^---\n(.*?)\n---", text, re.DOTALL)
    if not match:
        return None
    fields: dict[str, str] = {}
    lines = match.group(1).split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        key, colon, value = line.partition(":")
        if not colon or line[:1].isspace() or not key.strip() or key.lstrip().startswith("#"):
            continue
        value = value.strip()
        if value in _BLOCK_SCALARS:  # the indented lines that follow
            block: list[str] = []
            while i < len(lines) and (lines[i][:1].isspace() or not lines[i].strip()):
                block.append(lines[i].strip())
                i += 1
            value = (" " if value[0] == ">" else "\n").join(block).strip()
        elif len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        fields[key.strip()] = value
    if not fields.get("name") or not fields.get("description"):
        return None
    return {"name": fields["name"], "description": fields["description"]}


def skills_section(skills_dir: str | None) -> str:
    """Harbor's ``<available_skills>`` block for the first prompt: each ``DIR/*/SKILL.md`` (in
    path order) with its name, description and absolute path, which the model can ``cat`` to
    use the skill; empty where the folder holds none."""
    if not skills_dir or not os.path.isdir(skills_dir):
        return ""
    root = os.path.abspath(skills_dir)
    entries = []
    # Sorted as whole paths, as Harbor's ``find | sort`` lists them ("a-b/" before "a/").
    for path in sorted(os.path.join(root, name, "SKILL.md") for name in os.listdir(root)):
        if not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as fh:
            found = skill_frontmatter(fh.read())
        if found is not None:
            entries.append((found["name"], found["description"], path))
    if not entries:
        return ""
    # What Harbor's ElementTree writes (indented by two spaces), without importing it.
    lines = ["<available_skills>"]
    for name, description, path in entries:
        lines.append("  <skill>")
        for tag, text in (("name", name), ("description", description), ("location", path)):
            lines.append(f"    <{tag}>{_xml_text(text)}</{tag}>")
        lines.append("  </skill>")
    lines.append("</available_skills>")
    return "\n" + "\n".join(lines)


def _xml_text(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


# -- the loop ------------------------------------------------------------------------------------


def run(args: argparse.Namespace, state: dict[str, Any]) -> None:
    base = os.environ.get("VFRAY_BASE_URL", "").rstrip("/")
    if not base:
        raise Fatal("VFRAY_BASE_URL is not set")
    key, model, url = take_key(), os.environ.get("VFRAY_MODEL", ""), f"{base}/chat/completions"
    with open(args.task, encoding="utf-8") as fh:
        task = json.load(fh)
    if "key" in task:  # the secret came in the task file: gone once read, as a key file
        key = task.pop("key")
        with contextlib.suppress(OSError):
            os.unlink(args.task)
    terminal = state["terminal"] = Terminal(args.tmux, args.width, args.height)
    screen = limit_output(terminal.incremental(), args.max_output_bytes)
    instruction = task["instruction"] + skills_section(args.skills_dir)
    prompt = PROMPT.replace("{instruction}", instruction, 1)
    prompt = prompt.replace("{terminal_state}", screen, 1)
    messages: list[dict[str, Any]] = (
        [{"role": "system", "content": task["system"]}] if task.get("system") else []
    )
    pending = False
    while state["steps"] < args.max_steps:
        messages.append({"role": "user", "content": prompt})
        reply = post_chat(url, key, {"model": model, "messages": messages}, args)
        state["steps"] += 1
        choices = reply.get("choices") if isinstance(reply, dict) else None
        if not choices or not isinstance(choices[0].get("message"), dict):
            raise Fatal(f"the endpoint returned no message: {json.dumps(reply)[:1000]}")
        message = choices[0]["message"]
        messages.append(message)
        save_transcript(args.transcript, messages)
        text = message.get("content")
        parsed = parse_reply(text if isinstance(text, str) else "")
        warnings = "\n".join(f"- {w}" for w in parsed["warnings"])
        if parsed["error"]:
            feedback = f"ERROR: {parsed['error']}" + (f"\nWARNINGS: {warnings}" if warnings else "")
            prompt = (
                f"Previous response had parsing errors:\n{feedback}\n\n"
                "Please fix these issues and provide a proper JSON response."
            )
            continue
        for keys, seconds in parsed["commands"]:
            terminal.send(keys, seconds)
            state["commands"] += 1
        output = limit_output(terminal.incremental(), args.max_output_bytes)
        if parsed["complete"]:
            if pending:
                state["status"] = "completed"
                return
            pending = True
            prompt = CONFIRM.format(terminal=output)
            continue
        pending = False
        if warnings:
            prompt = f"Previous response had warnings:\nWARNINGS: {warnings}\n\n{output}"
        else:
            prompt = output
    state["status"] = "max_steps"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="terminus_loop", description=__doc__)
    parser.add_argument("--task", required=True, help="JSON file: instruction and system prompt")
    parser.add_argument("--tmux", default="tmux", help="the tmux program")
    parser.add_argument("--transcript", help="write the conversation here after each step")
    parser.add_argument("--skills-dir", help="offer the skills of DIR/*/SKILL.md in the prompt")
    parser.add_argument("--max-steps", type=int, default=1000)
    parser.add_argument("--max-output-bytes", type=int, default=10000)
    parser.add_argument("--width", type=int, default=160)
    parser.add_argument("--height", type=int, default=40)
    parser.add_argument("--request-timeout", type=float, default=600.0)
    parser.add_argument("--retries", type=int, default=2)
    parser.add_argument("--backoff", type=float, default=0.5)
    return parser.parse_args(argv)


def _terminated(signum: int, frame: object) -> None:
    raise Stopped(f"ended by signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    # A stop SIGTERMs the program: the tmux server it started is a daemon outside its process
    # group, so the ``finally`` below must run to end it.
    signal.signal(signal.SIGTERM, _terminated)
    signal_ready()
    state: dict[str, Any] = {"status": "error", "steps": 0, "commands": 0}
    code = 0
    try:
        run(args, state)
    except Stopped as exc:
        state["status"] = "stopped"
        state["reason"] = str(exc)
        log(f"stopped by the interception: {exc}")
    except Fatal as exc:
        state["error"] = str(exc)
        log(f"error: {exc}")
        code = exc.code
    finally:
        terminal = state.pop("terminal", None)
        if terminal is not None:
            terminal.close()
    print(json.dumps({"terminus_2": state.pop("status"), **state}), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
