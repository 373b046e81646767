#!/usr/bin/env python3
"""vfray's built-in agent: a stdlib-only chat-completions loop with optional bash and edit tools.

It runs inside the box under any python3, talks only to ``$VFRAY_BASE_URL`` (the interception)
with ``$VFRAY_API_KEY`` (the rollout secret), and prints one JSON summary line on stdout.

Two options make it the ``compact`` and ``rlm`` harnesses: ``--compact-at TOKENS`` replaces the
conversation after the task by a model-written summary once the context passes TOKENS, and
``--rlm-depth N`` offers an ``ask`` tool that answers a sub-question in a fresh context of its
own (N levels deep). Either starts a context the interception records as a new branch.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import subprocess

# Every rollout starts this program afresh, so what it imports is paid per rollout: urllib
# (with http.client and email) and subprocess cost ~60 ms of CPU of the ~90 ms a start took
# (benchmarks/program_start.py). Plain-HTTP calls to the interception go over a socket here;
# urllib is imported only for https or a proxy that applies to the host (a box's egress gate
# sets one, with the interception in no_proxy), subprocess only when the model runs a command.

EXIT_ERROR = 2
"""Exit status for a refused request, a malformed reply or a bad configuration."""
EXIT_UNREACHABLE = 3
"""Exit status when the endpoint stayed unreachable (or kept failing) after every retry."""

TOOL_SCHEMAS: dict[str, dict[str, Any]] = {
    "bash": {
        "type": "function",
        "function": {
            "name": "bash",
            "description": (
                "Run a shell command in the working directory and return its combined "
                "stdout and stderr (long output is cut in the middle)."
            ),
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string", "description": "The command."}},
                "required": ["command"],
            },
        },
    },
    "edit": {
        "type": "function",
        "function": {
            "name": "edit",
            "description": (
                "Edit a text file. With `old`, replace its single occurrence by `new`; "
                "without `old`, create or overwrite the file with `new`."
            ),
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "File path (relative: work dir)."},
                    "old": {"type": "string", "description": "Exact text to replace."},
                    "new": {"type": "string", "description": "Replacement or file content."},
                },
                "required": ["path", "new"],
            },
        },
    },
}


class Stopped(Exception):
    """The interception refused the call because a limit ended the rollout: a clean stop."""


class Fatal(Exception):
    """An error the loop cannot continue after; carries the exit status."""

    def __init__(self, message: str, code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.code = code


def log(message: str) -> None:
    print(f"chat_loop: {message}", file=sys.stderr, flush=True)


# -- tools -------------------------------------------------------------------------------------


def truncate_middle(text: str, limit: int, omitted: int = 0) -> str:
    """Keep the head and tail of ``text`` (the start says what ran, the end how it ended)."""
    if len(text) <= limit and not omitted:
        return text
    half = max(limit // 2, 1)
    cut = omitted + max(len(text) - 2 * half, 0)
    if len(text) <= 2 * half:
        head, tail = text[: len(text) // 2], text[len(text) // 2 :]
    else:
        head, tail = text[:half], text[-half:]
    return f"{head}\n[... {cut} characters truncated ...]\n{tail}"


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def run_bash(command: str, timeout: float, limit: int) -> str:
    """Run ``command`` in its own process group, streaming its output into bounded head and
    tail buffers so a command that floods stdout cannot exhaust memory."""
    import select
    import shutil
    import subprocess

    shell = shutil.which("bash") or shutil.which("sh") or "/bin/sh"
    proc = subprocess.Popen(
        [shell, "-c", command],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        # The rollout secret is for this program, not for the commands the model writes.
        env={k: v for k, v in os.environ.items() if k != "VFRAY_API_KEY"},
    )
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    head, tail, total = bytearray(), bytearray(), 0
    deadline = time.monotonic() + timeout
    timed_out = False
    exited_at: float | None = None
    while True:
        now = time.monotonic()
        if now >= deadline:
            timed_out = proc.poll() is None
            break
        # A background child may keep the pipe open after the shell exits; give it a short
        # grace to flush, then stop reading rather than wait for the whole timeout.
        if exited_at is None and proc.poll() is not None:
            exited_at = now
        if exited_at is not None and now - exited_at > 0.2:
            break
        ready, _, _ = select.select([fd], [], [], min(deadline - now, 0.05))
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        total += len(chunk)
        if len(head) < limit:
            take = limit - len(head)
            head += chunk[:take]
            chunk = chunk[take:]
        tail += chunk
        if len(tail) > limit:
            del tail[: len(tail) - limit]
    if timed_out:
        _kill_group(proc)
    proc.stdout.close()
    code = proc.wait()
    text = head.decode("utf-8", "replace")
    if total > len(head):
        rest = tail.decode("utf-8", "replace")
        dropped = total - len(head) - len(tail)
        text = truncate_middle(text + rest, limit, omitted=dropped)
    else:
        text = truncate_middle(text, limit)
    if timed_out:
        return f"{text}\n[command timed out after {timeout:g} s and was killed]"
    if code != 0:
        return f"{text}\n[exit code {code}]"
    return text


def run_edit(path: str, new: str, old: str | None) -> str:
    """Replace the single occurrence of ``old`` by ``new``, or write ``new`` as the file."""
    if not old:
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(new)
        return f"wrote {path} ({len(new)} characters)"
    try:
        with open(path, encoding="utf-8") as fh:
            content = fh.read()
    except OSError as exc:
        return f"error: cannot read {path}: {exc.strerror or exc}"
    count = content.count(old)
    if count != 1:
        where = "not found" if count == 0 else f"found {count} times; add context to make it unique"
        return f"error: the old text was {where} in {path}"
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(content.replace(old, new, 1))
    return f"edited {path}"


def call_tool(name: str, raw_args: Any, tools: list[str], args: argparse.Namespace) -> str:
    """Execute one tool call; a bad call becomes an error message the model can read."""
    if name not in tools:
        return f"error: unknown tool {name!r}; available: {', '.join(tools) or 'none'}"
    try:
        params = json.loads(raw_args) if isinstance(raw_args, str) else dict(raw_args or {})
    except (ValueError, TypeError) as exc:
        return f"error: the arguments are not valid JSON: {exc}"
    if not isinstance(params, dict):
        return "error: the arguments must be a JSON object"
    try:
        if name == "bash":
            command = params.get("command")
            if not isinstance(command, str):
                return "error: `command` (a string) is required"
            return run_bash(command, args.command_timeout, args.max_output_chars)
        path, new, old = params.get("path"), params.get("new"), params.get("old")
        if not isinstance(path, str) or not isinstance(new, str):
            return "error: `path` and `new` (strings) are required"
        return run_edit(path, new, old if isinstance(old, str) else None)
    except OSError as exc:
        return f"error: {name} failed: {exc}"


# -- HTTP ---------------------------------------------------------------------------------------


class HttpError(Exception):
    """A reply with a status of 400 or more."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}")
        self.status, self.body = status, body


_PROXY_VARS = ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY")


def _proxied(host: str, authority: str) -> bool:
    """Whether a proxy from the environment applies to ``host``: one is set and ``no_proxy``
    does not name the host (or a domain it is in), as urllib reads it. A box's egress gate sets
    a proxy and names the interception in ``no_proxy``: its calls go over the socket here."""
    if not any(os.environ.get(v) for v in _PROXY_VARS):
        return False
    skip = os.environ.get("no_proxy") or os.environ.get("NO_PROXY") or ""
    names = (host.lower(), authority.lower())
    for entry in skip.replace(" ", "").split(","):
        if entry == "*":
            return False
        entry = entry.lstrip(".").lower()
        if entry and any(n == entry or n.endswith("." + entry) for n in names):
            return False
    return True


_KEPT: dict[tuple[str, int], socket.socket] = {}
"""The open connection to each endpoint a model call left for the next (HTTP keep-alive): a
call on a connection of its own cost the interception an accept, a protocol and a close."""


class _Stale(Exception):
    """A kept connection the server had closed while it sat idle: nothing of a reply came."""


def http_post(
    url: str, data: bytes, headers: dict[str, str], timeout: float, keep_alive: bool = False
) -> tuple[dict[str, str], bytes]:
    """POST ``data``; returns the reply's headers (lower-cased names) and body. Raises
    :class:`HttpError` for a status of 400 or more and ``OSError`` when unreachable.
    ``keep_alive``: the connection stays open for the next call to the same host and port."""
    scheme, _, rest = url.partition("://")
    authority, _, path = rest.partition("/")
    host, port = authority, 80
    if authority.startswith("["):  # [::1]:8000
        bracket = authority.index("]")
        host, after = authority[1:bracket], authority[bracket + 1 :]
        port = int(after[1:]) if after.startswith(":") else 80
    elif ":" in authority:
        name, _, digits = authority.rpartition(":")
        host, port = name, int(digits)
    if scheme != "http" or _proxied(host, authority):
        return _urllib_post(url, data, headers, timeout)
    lines = [f"POST /{path} HTTP/1.1", f"Host: {authority}", f"Content-Length: {len(data)}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    lines += ([] if keep_alive else ["Connection: close"]) + ["", ""]
    request = "\r\n".join(lines).encode("latin-1") + data
    key = (host, port)
    kept = _KEPT.pop(key, None) if keep_alive else None
    if kept is not None:
        try:
            return _exchange(kept, key, authority, request, keep_alive, reused=True)
        except _Stale:
            pass  # closed while idle (a server's restart): the request goes on a new one
    conn = socket.create_connection((host, port), timeout=timeout)
    try:
        return _exchange(conn, key, authority, request, keep_alive, reused=False)
    except _Stale:
        raise OSError(f"the connection to {authority} closed before a complete reply") from None


def _exchange(
    conn: socket.socket,
    key: tuple[str, int],
    authority: str,
    request: bytes,
    keep_alive: bool,
    reused: bool,
) -> tuple[dict[str, str], bytes]:
    """Send ``request`` on ``conn`` and read its reply, leaving ``conn`` in :data:`_KEPT`
    when the reply's end was framed and both sides keep the connection; closed otherwise."""
    kept = False
    raw = b""
    try:
        try:
            conn.sendall(request)
            while b"\r\n\r\n" not in raw:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                raw += chunk
        except (BrokenPipeError, ConnectionResetError):
            if reused and not raw:
                raise _Stale from None
            raise
        head, sep, body = raw.partition(b"\r\n\r\n")
        if not sep:
            if reused and not raw:
                raise _Stale
            raise OSError(f"the connection to {authority} closed before a complete reply")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or not parts[1].isdigit():
            raise OSError(f"not an HTTP reply from {authority}: {status_line[:100]!r}")
        reply = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            reply[name.strip().lower()] = value.strip()
        framed = True
        if "chunked" in reply.get("transfer-encoding", "").lower():
            while (whole := _dechunked(body)) is None:
                chunk = conn.recv(65536)
                if not chunk:
                    raise OSError("a chunked reply ended early")
                body += chunk
            body = whole
        elif reply.get("content-length", "").isdigit():
            length = int(reply["content-length"])
            while len(body) < length:
                chunk = conn.recv(65536)
                if not chunk:
                    raise OSError(f"the connection to {authority} closed mid-reply")
                body += chunk
            body = body[:length]
        else:  # the reply ends when the server closes
            framed = False
            while chunk := conn.recv(65536):
                body += chunk
        kept = keep_alive and framed and reply.get("connection", "").lower() != "close"
        if kept:
            _KEPT[key] = conn
        if int(parts[1]) >= 400:
            raise HttpError(int(parts[1]), body)
        return reply, body
    finally:
        if not kept:
            conn.close()


def _dechunked(raw: bytes) -> bytes | None:
    """The body of a chunked reply; None while its last chunk has not arrived."""
    # Called again as each piece arrives: a whole reply ends with an empty line, so the chunks
    # are walked only when it could be whole (not once per piece of a long stream).
    if not raw.endswith(b"\r\n\r\n"):
        return None
    out, at = bytearray(), 0
    while True:
        end = raw.find(b"\r\n", at)
        if end < 0:
            return None
        size = int(raw[at:end].split(b";")[0], 16)
        if size == 0:
            # The last chunk, then trailers (if any) up to an empty line.
            return bytes(out) if raw.find(b"\r\n\r\n", end) >= 0 else None
        if len(raw) < end + 2 + size + 2:
            return None
        out += raw[end + 2 : end + 2 + size]
        at = end + 2 + size + 2


def _urllib_post(
    url: str, data: bytes, headers: dict[str, str], timeout: float
) -> tuple[dict[str, str], bytes]:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, data=data, headers=headers, method="POST")
    try:
        # Its own opener: proxies from the environment, whatever a host process installed.
        with urllib.request.build_opener().open(request, timeout=timeout) as response:
            found = {name.lower(): value for name, value in response.headers.items()}
            return found, response.read()
    except urllib.error.HTTPError as exc:
        raise HttpError(exc.code, exc.read()) from None
    except urllib.error.URLError as exc:
        raise OSError(str(exc.reason)) from None


# -- MCP tools (streamable HTTP, stdlib only) ---------------------------------------------------


class McpClient:
    """One MCP server over streamable HTTP: JSON-RPC POSTs answered as JSON or as an SSE
    stream; the session id the server hands out (if any) goes back on every request."""

    def __init__(self, name: str, url: str, timeout: float) -> None:
        self.name, self.url, self.timeout = name, url, timeout
        self.session: str | None = None
        self.next_id = 0

    def post(self, method: str, params: dict[str, Any] | None = None, notify: bool = False) -> Any:
        body: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            body["params"] = params
        if not notify:
            self.next_id += 1
            body["id"] = self.next_id
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": "2025-06-18",
        }
        if self.session:
            headers["Mcp-Session-Id"] = self.session
        try:
            found, data = http_post(self.url, json.dumps(body).encode(), headers, self.timeout)
        except HttpError as exc:
            raise RuntimeError(f"{exc}: {exc.body[:500].decode('utf-8', 'replace')}") from None
        self.session = found.get("mcp-session-id") or self.session
        kind = found.get("content-type", "")
        raw = data.decode("utf-8", "replace")
        if notify:
            return None
        replies = (
            # Lines end at "\n" only: a tool's text may hold U+2028, which splitlines splits.
            [json.loads(line[5:]) for line in raw.split("\n") if line.startswith("data:")]
            if "text/event-stream" in kind
            else [json.loads(raw)]
        )
        for reply in replies:
            if isinstance(reply, dict) and reply.get("id") == body["id"]:
                if "error" in reply:
                    raise RuntimeError(f"MCP error from {self.name}: {reply['error']}")
                return reply.get("result")
        raise RuntimeError(f"no MCP reply from {self.name} to {method}")

    def start(self) -> list[dict[str, Any]]:
        self.post(
            "initialize",
            {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "vfray-chat-loop", "version": "1"},
            },
        )
        self.post("notifications/initialized", notify=True)
        return list((self.post("tools/list", {}) or {}).get("tools", []))

    def call(self, name: str, arguments: dict[str, Any]) -> str:
        result = self.post("tools/call", {"name": name, "arguments": arguments}) or {}
        text = "\n".join(
            str(part.get("text", "")) if part.get("type") == "text" else json.dumps(part)
            for part in result.get("content", [])
            if isinstance(part, dict)
        )
        return f"error: {text}" if result.get("isError") else text


def connect_mcp(
    specs: list[str], timeout: float
) -> dict[str, tuple[McpClient, str, dict[str, Any]]]:
    """``NAME=URL`` specs -> {exposed tool name: (client, tool name, chat tool schema)}. A tool
    whose name another tool already has is exposed as ``server__tool``."""
    exposed: dict[str, tuple[McpClient, str, dict[str, Any]]] = {}
    for spec in specs:
        name, _, url = spec.partition("=")
        client = McpClient(name, url, timeout)
        try:
            tools = client.start()
        except (OSError, ValueError, RuntimeError) as exc:
            raise Fatal(f"MCP server {name!r} at {url} did not answer: {exc}") from None
        for tool in tools:
            tname = str(tool.get("name"))
            key = (
                tname if tname not in exposed and tname not in TOOL_SCHEMAS else f"{name}__{tname}"
            )
            schema = {
                "type": "function",
                "function": {
                    "name": key,
                    "description": tool.get("description") or "",
                    "parameters": tool.get("inputSchema") or {"type": "object"},
                },
            }
            exposed[key] = (client, tname, schema)
    return exposed


def call_mcp(entry: tuple[McpClient, str, dict[str, Any]], raw_args: Any, limit: int) -> str:
    client, name, _ = entry
    try:
        params = json.loads(raw_args) if isinstance(raw_args, str) else dict(raw_args or {})
    except (ValueError, TypeError) as exc:
        return f"error: the arguments are not valid JSON: {exc}"
    try:
        return truncate_middle(client.call(name, params if isinstance(params, dict) else {}), limit)
    except (OSError, ValueError, RuntimeError) as exc:
        return f"error: the MCP call to {client.name}.{name} failed: {exc}"


# -- the model endpoint ------------------------------------------------------------------------


def post_chat(url: str, key: str, body: dict[str, Any], args: argparse.Namespace) -> Any:
    """POST one chat completion, retrying 429/5xx and connection errors with backoff. Each
    retry says its number in ``x-stainless-retry-count`` so the interception answers it from
    the stored result instead of sampling again."""
    data = json.dumps(body).encode()
    problem = ""
    for attempt in range(args.retries + 1):
        headers = {
            "Content-Type": "application/json",
            "Authorization": f"Bearer {key}",
            "x-stainless-retry-count": str(attempt),
        }
        try:
            reply = http_post(url, data, headers, args.request_timeout, keep_alive=True)
            return json.loads(reply[1])
        except HttpError as exc:
            detail = exc.body.decode("utf-8", "replace")
            if exc.status < 500 and "rollout stopped" in detail:
                raise Stopped(_error_message(detail)) from None
            if exc.status != 429 and exc.status < 500:
                raise Fatal(f"HTTP {exc.status} from {url}: {detail[:2000]}") from None
            problem = f"HTTP {exc.status}: {detail[:500]}"
        except OSError as exc:
            problem = f"cannot reach {url}: {exc}"
        except ValueError as exc:
            raise Fatal(f"the endpoint returned invalid JSON: {exc}") from None
        if attempt < args.retries:
            log(f"{problem}; retrying ({attempt + 1}/{args.retries})")
            time.sleep(args.backoff * 2**attempt)
    raise Fatal(f"giving up after {args.retries + 1} attempts: {problem}", EXIT_UNREACHABLE)


def _error_message(detail: str) -> str:
    try:
        payload = json.loads(detail)
    except ValueError:
        return detail.strip()
    error = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return str(error["message"])
    if isinstance(error, str):
        return error
    return detail.strip()


# -- the loop ----------------------------------------------------------------------------------


def load_messages(args: argparse.Namespace) -> list[dict[str, Any]]:
    if args.messages:
        with open(args.messages, encoding="utf-8") as fh:
            messages = json.load(fh)
    elif os.environ.get("VFRAY_MESSAGES"):
        messages = json.loads(os.environ["VFRAY_MESSAGES"])
    elif os.environ.get("VFRAY_PROMPT"):
        messages = [{"role": "user", "content": os.environ["VFRAY_PROMPT"]}]
    else:
        raise Fatal("no prompt: pass --messages FILE or set VFRAY_MESSAGES / VFRAY_PROMPT")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise Fatal("the prompt must be a JSON list of chat messages")
    return messages


def save_transcript(path: str | None, messages: list[dict[str, Any]]) -> None:
    if not path:
        return
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(messages, fh)
    os.replace(tmp, path)


COMPACT_REQUEST = "Summarise the conversation so far for a fresh context"
"""Opens the compaction request (the scripted ``agent`` model answers it with a summary)."""
COMPACTED = "[The earlier context was compacted. Summary of the work so far:]"
"""Opens the user message that carries the summary into the new context."""
ASK_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "ask",
        "description": (
            "Ask a fresh copy of yourself a self-contained sub-question. It starts from an "
            "empty context with the same tools, works until it answers, and its final answer "
            "is returned here."
        ),
        "parameters": {
            "type": "object",
            "properties": {"question": {"type": "string", "description": "The sub-question."}},
            "required": ["question"],
        },
    },
}
"""The recursive sub-call tool, offered while ``--rlm-depth`` allows one more level."""


class Session:
    """What every context of one run shares: the endpoint, the tools and the counters."""

    def __init__(self, args: argparse.Namespace, state: dict[str, Any]) -> None:
        base = os.environ.get("VFRAY_BASE_URL", "").rstrip("/")
        if not base:
            raise Fatal("VFRAY_BASE_URL is not set")
        self.args, self.state = args, state
        self.key = take_key()
        self.model = os.environ.get("VFRAY_MODEL", "")
        self.url = f"{base}/chat/completions"
        disabled = {t for t in args.disable.split(",") if t}
        tools = [t for t in args.tools.split(",") if t and t not in disabled] if args.tools else []
        unknown = [t for t in tools if t not in TOOL_SCHEMAS]
        if unknown:
            raise Fatal(f"unknown tools {unknown}; known: {sorted(TOOL_SCHEMAS)}")
        self.tools = tools
        mcp = connect_mcp(args.mcp, args.request_timeout)
        # A disabled tool is not offered, by its exposed name, its own, or as server__tool.
        self.mcp = {
            k: v for k, v in mcp.items() if not {k, v[1], f"{v[0].name}__{v[1]}"} & disabled
        }
        self.schemas = [TOOL_SCHEMAS[t] for t in tools] + [e[2] for e in self.mcp.values()]

    def complete(self, messages: list[dict[str, Any]], schemas: list[Any]) -> dict[str, Any]:
        """One model call (counted against ``--max-steps``); returns the reply's message."""
        body: dict[str, Any] = {"model": self.model, "messages": messages}
        if schemas:
            body["tools"] = schemas
        reply = post_chat(self.url, self.key, body, self.args)
        self.state["steps"] += 1
        choices = reply.get("choices") if isinstance(reply, dict) else None
        if not choices or not isinstance(choices[0].get("message"), dict):
            raise Fatal(f"the endpoint returned no message: {json.dumps(reply)[:1000]}")
        usage = reply.get("usage")
        total = usage.get("total_tokens") if isinstance(usage, dict) else None
        # The context's size as the model counted it; without usage, ~4 characters a token.
        self.last_tokens = total if isinstance(total, int) else len(json.dumps(messages)) // 4
        message: dict[str, Any] = choices[0]["message"]
        return message


def converse(session: Session, messages: list[dict[str, Any]], depth: int) -> str | None:
    """Drive one context until the model answers without a tool call; returns that answer, or
    None when ``--max-steps`` ran out. ``messages`` is changed in place (the transcript)."""
    args, state = session.args, session.state
    schemas = session.schemas + ([ASK_SCHEMA] if depth < args.rlm_depth else [])
    # What a compaction keeps: the system prompt and the first user message (the task).
    first_user = next((i for i, m in enumerate(messages) if m.get("role") == "user"), -1)
    keep = first_user + 1
    root = depth == 0
    while state["steps"] < args.max_steps:
        message = session.complete(messages, schemas)
        # Sent back unchanged, so the interception sees its own reply as the history prefix.
        messages.append(message)
        if root:
            save_transcript(args.transcript, messages)
        calls = message.get("tool_calls") or []
        if not calls:
            content = message.get("content")
            return content if isinstance(content, str) else ""
        for tool_call in calls:
            function = tool_call.get("function") or {}
            fname = str(function.get("name"))
            if fname == "ask" and depth < args.rlm_depth:
                output = ask(session, messages[:first_user], function.get("arguments"), depth)
            elif fname in session.mcp:
                output = call_mcp(
                    session.mcp[fname], function.get("arguments"), args.max_output_chars
                )
            else:
                output = call_tool(fname, function.get("arguments"), session.tools, args)
            state["tool_calls"] += 1
            messages.append(
                {"role": "tool", "tool_call_id": tool_call.get("id"), "content": output}
            )
        if args.compact_at and session.last_tokens >= args.compact_at and len(messages) > keep:
            compact(session, messages, keep)
        if root:
            save_transcript(args.transcript, messages)
    return None


def compact(session: Session, messages: list[dict[str, Any]], keep: int) -> None:
    """Replace everything after the first ``keep`` messages by a model-written summary. The
    new context is no extension of the old one, so the interception opens a new branch."""
    request = [
        *messages,
        {
            "role": "user",
            "content": f"{COMPACT_REQUEST}: the task, what was done and what is left. "
            "Answer in text only; the summary replaces the conversation.",
        },
    ]
    summary = session.complete(request, []).get("content") or ""
    messages[keep:] = [{"role": "user", "content": f"{COMPACTED}\n{summary}"}]
    session.state["compactions"] = session.state.get("compactions", 0) + 1


def ask(session: Session, system: list[dict[str, Any]], raw_args: Any, depth: int) -> str:
    """The ``ask`` tool: a sub-question answered in a fresh context of its own (one level
    deeper), which the interception records as a branch of its own."""
    try:
        params = json.loads(raw_args) if isinstance(raw_args, str) else dict(raw_args or {})
    except (ValueError, TypeError) as exc:
        return f"error: the arguments are not valid JSON: {exc}"
    question = params.get("question") if isinstance(params, dict) else None
    if not isinstance(question, str) or not question.strip():
        return "error: `question` (a non-empty string) is required"
    session.state["sub_calls"] = session.state.get("sub_calls", 0) + 1
    answer = converse(session, [*system, {"role": "user", "content": question}], depth + 1)
    if answer is None:
        return "error: the sub-call ran out of steps before it answered"
    return answer


def chat(args: argparse.Namespace, state: dict[str, Any]) -> None:
    """Drive the conversation until the model stops calling tools (or max steps)."""
    session = Session(args, state)
    messages = state["messages"] = load_messages(args)
    final = converse(session, messages, 0)
    if final is None:
        state["status"] = "max_steps"
    else:
        state["status"] = "completed"
        state["final"] = final


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="chat_loop", description=__doc__)
    parser.add_argument("--messages", help="JSON file with the prompt messages")
    parser.add_argument("--tools", default="", help="comma-separated tools: bash,edit")
    parser.add_argument("--disable", default="", help="comma-separated tools not to offer")
    parser.add_argument(
        "--mcp", action="append", default=[], help="an MCP server as NAME=URL (repeatable)"
    )
    parser.add_argument("--transcript", help="write the conversation here after each step")
    parser.add_argument("--max-steps", type=int, default=50)
    parser.add_argument("--command-timeout", type=float, default=120.0)
    parser.add_argument("--max-output-chars", type=int, default=16384)
    parser.add_argument("--request-timeout", type=float, default=600.0)
    parser.add_argument("--retries", type=int, default=2)
    parser.add_argument("--backoff", type=float, default=0.5)
    parser.add_argument(
        "--compact-at", type=int, default=0, help="compact past this many context tokens"
    )
    parser.add_argument(
        "--rlm-depth", type=int, default=0, help="levels of recursive `ask` sub-calls"
    )
    return parser.parse_args(argv)


def take_key() -> str:
    """The rollout secret, kept from the bash tool's commands (they run as this program's user):
    read from ``$VFRAY_API_KEY_FILE``, a file deleted once read (so it is in no process's
    environment), else ``$VFRAY_API_KEY``; and this process made non-dumpable, so no process
    without CAP_SYS_PTRACE can read its ``/proc/PID/environ`` or memory."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0
    path = os.environ.pop("VFRAY_API_KEY_FILE", "")
    if path:
        try:
            with open(path, encoding="utf-8") as fh:
                key = fh.read().strip()
        except OSError as exc:
            raise Fatal(f"cannot read the key file: {exc}") from exc
        with contextlib.suppress(OSError):
            os.unlink(path)
        return key
    return os.environ.pop("VFRAY_API_KEY", "")


def signal_ready() -> None:
    """Tell the runtime this program is up (a launch throttle holds a slot until then): one
    byte on the fd it named in ``$VFRAY_READY_FD``, which the bash tool's commands never see."""
    fd = os.environ.pop("VFRAY_READY_FD", "")
    if fd.isdigit():
        with contextlib.suppress(OSError):
            os.write(int(fd), b".")
            os.close(int(fd))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    signal_ready()
    state: dict[str, Any] = {"status": "error", "steps": 0, "tool_calls": 0, "final": None}
    code = 0
    try:
        chat(args, state)
    except Stopped as exc:
        state["status"] = "stopped"
        state["reason"] = str(exc)
        log(f"stopped by the interception: {exc}")
    except Fatal as exc:
        state["error"] = str(exc)
        log(f"error: {exc}")
        code = exc.code
    state.pop("messages", None)
    print(json.dumps({"chat_loop": state.pop("status"), **state}), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
