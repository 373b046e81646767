"""The scripted ``agent`` policy over real sockets, driven by the real openai and anthropic SDKs:
small agent loops in each dialect (streaming or not) run its plan with real shell commands, in
the request shapes real agents send (agents.md)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from vfray.models.scripted.agent import SUBMIT_COMMAND, find_shell, plan
from vfray.models.scripted.conversation import Conversation
from vfray.models.scripted.server import ScriptedModel, scripted_server

TASK = 'Please write "hello agent" to out.txt and tell me when you are done.'


@pytest.fixture
def served() -> Iterator[tuple[ScriptedModel, str]]:
    model = ScriptedModel("agent")
    with scripted_server(model) as url:
        yield model, url


def sh(command: str | list[str], cwd: Path) -> str:
    argv = command if isinstance(command, list) else ["bash", "-c", command]
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=30)
    return done.stdout + done.stderr


def _schema(argument: str = "command", kind: str = "string") -> dict[str, Any]:
    return {"type": "object", "properties": {argument: {"type": kind}}, "required": [argument]}


def chat_agent(url: str, cwd: Path, stream: bool, tool: str, argument: str) -> list[str]:
    """A chat-completions agent loop; returns every command it ran, then the final answer."""
    client = openai.OpenAI(base_url=url, api_key="k")
    tools = [
        {"type": "function", "function": {"name": "read_file", "parameters": _schema("path")}},
        {"type": "function", "function": {"name": tool, "parameters": _schema(argument)}},
    ]
    messages: list[Any] = [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": TASK},
    ]
    ran: list[str] = []
    for _ in range(6):
        if stream:
            with client.chat.completions.stream(
                model="m",
                messages=messages,
                tools=tools,  # type: ignore[arg-type]
            ) as events:
                message = events.get_final_completion().choices[0].message
        else:
            message = (
                client.chat.completions.create(
                    model="m",
                    messages=messages,
                    tools=tools,  # type: ignore[arg-type]
                )
                .choices[0]
                .message
            )
        if not message.tool_calls:
            return [*ran, message.content or ""]
        call = message.tool_calls[0]
        assert call.type == "function" and call.function.name == tool
        command = json.loads(call.function.arguments)[argument]
        ran.append(command)
        messages.append(message.model_dump(exclude_none=True))
        messages.append({"role": "tool", "tool_call_id": call.id, "content": sh(command, cwd)})
    raise AssertionError("the policy never stopped")


def responses_agent(url: str, cwd: Path, stream: bool) -> list[str]:
    """A Codex-shaped Responses loop: developer messages, an environment-context user message,
    an ``exec_command`` tool taking ``cmd``, a namespace tool, reasoning items kept in input."""
    client = openai.OpenAI(base_url=url, api_key="k")
    tools: list[Any] = [
        {"type": "function", "name": "exec_command", "parameters": _schema("cmd"), "strict": False},
        {"type": "function", "name": "write_stdin", "parameters": _schema("chars")},
        {"type": "namespace", "name": "multi_agent_v1", "tools": []},
        {"type": "web_search"},
    ]
    items: list[Any] = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "d1"}]},
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "d2"}]},
        {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_text", "text": "<environment_context>x</environment_context>"}
            ],
        },
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": TASK}]},
    ]
    ran: list[str] = []
    options: dict[str, Any] = {"store": False, "include": ["reasoning.encrypted_content"]}
    for _ in range(6):
        if stream:
            with client.responses.stream(model="m", input=items, tools=tools, **options) as events:
                response = events.get_final_response()
        else:
            response = client.responses.create(model="m", input=items, tools=tools, **options)
        calls = [o for o in response.output if o.type == "function_call"]
        if not calls:
            return [*ran, response.output_text]
        call = calls[0]
        assert call.name == "exec_command"
        command = json.loads(call.arguments)["cmd"]
        ran.append(command)
        items.append({"type": "reasoning", "summary": [], "encrypted_content": "opaque"})
        items.append(call.model_dump(exclude_none=True))
        items.append(
            {"type": "function_call_output", "call_id": call.call_id, "output": sh(command, cwd)}
        )
    raise AssertionError("the policy never stopped")


def anthropic_agent(url: str, cwd: Path, stream: bool) -> list[str]:
    """A Claude-Code-shaped loop: ``system`` as text blocks, a ``role: "system"`` entry inside
    ``messages``, a ``Bash`` tool among others."""
    client = anthropic.Anthropic(base_url=url.removesuffix("/v1"), api_key="k")
    tools: list[Any] = [
        {"name": "Read", "input_schema": _schema("file_path")},
        {
            "name": "Bash",
            "input_schema": {
                **_schema(),
                "properties": {"command": {"type": "string"}, "description": {"type": "string"}},
            },
        },
    ]
    system: Any = [{"type": "text", "text": "You are Claude Code."}, {"type": "text", "text": "x"}]
    messages: list[Any] = [
        {"role": "system", "content": "Environment: linux"},
        {"role": "user", "content": [{"type": "text", "text": TASK}]},
    ]
    ran: list[str] = []
    for _ in range(6):
        # The SDK's types know no system role inside messages; real Claude Code sends one.
        body: dict[str, Any] = {
            "model": "m",
            "max_tokens": 128000 if stream else 4096,
            "system": system,
            "messages": messages,
            "tools": tools,
        }
        if stream:
            with client.messages.stream(**body) as events:
                reply = events.get_final_message()
        else:
            reply = client.messages.create(**body)
        uses = [b for b in reply.content if b.type == "tool_use"]
        if not uses:
            return [*ran, "".join(b.text for b in reply.content if b.type == "text")]
        use = uses[0]
        assert use.name == "Bash"
        command = use.input["command"]  # type: ignore[index]
        ran.append(command)
        messages.append({"role": "assistant", "content": [b.model_dump() for b in reply.content]})
        messages.append(
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": use.id, "content": sh(command, cwd)}
                ],
            }
        )
    raise AssertionError("the policy never stopped")


def _check_run(ran: list[str], cwd: Path) -> None:
    *commands, final = ran
    assert len(commands) == 2, ran
    assert commands[1] == "cat out.txt"
    assert (cwd / "out.txt").read_text() == "hello agent\n"
    assert final == "Done. hello agent"


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize(
    ("tool", "argument"), [("bash", "command"), ("shell", "cmd")], ids=["bash", "shell-cmd"]
)
def test_chat_agent_runs_the_plan_then_answers(
    served: tuple[ScriptedModel, str], tmp_path: Path, stream: bool, tool: str, argument: str
) -> None:
    model, url = served
    _check_run(chat_agent(url, tmp_path, stream, tool, argument), tmp_path)
    assert model.calls == 3


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_responses_agent_runs_the_plan_with_exec_command(
    served: tuple[ScriptedModel, str], tmp_path: Path, stream: bool
) -> None:
    _check_run(responses_agent(served[1], tmp_path, stream), tmp_path)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_anthropic_agent_runs_the_plan_with_claude_code_shapes(
    served: tuple[ScriptedModel, str], tmp_path: Path, stream: bool
) -> None:
    _check_run(anthropic_agent(served[1], tmp_path, stream), tmp_path)


def test_mini_swe_agent_protocol_ends_with_the_submit_command(
    served: tuple[ScriptedModel, str], tmp_path: Path
) -> None:
    """mini-swe-agent 2.x: a ``bash`` tool, a template naming the submit command, which must be
    the last action (a text answer would be a format error to it)."""
    _, url = served
    client = openai.OpenAI(base_url=url, api_key="k")
    tools: Any = [{"type": "function", "function": {"name": "bash", "parameters": _schema()}}]
    prompt = f"Please solve this issue: {TASK}\n\nFinish with `{SUBMIT_COMMAND}`.\n```bash\nls\n```"
    messages: list[Any] = [{"role": "user", "content": prompt}]
    ran = []
    while len(ran) < 5:
        message = client.chat.completions.create(model="m", messages=messages, tools=tools)
        call = message.choices[0].message.tool_calls[0]  # type: ignore[index]
        command = json.loads(call.function.arguments)["command"]  # type: ignore[union-attr]
        ran.append(command)
        output = sh(command, tmp_path)
        if output.startswith("COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"):
            break
        messages += [
            message.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": output},
        ]
    assert ran[1:] == ["cat out.txt", SUBMIT_COMMAND]
    assert (tmp_path / "out.txt").read_text() == "hello agent\n"


def test_text_protocol_answers_with_a_fenced_block(
    served: tuple[ScriptedModel, str], tmp_path: Path
) -> None:
    """With no shell tool, the command comes as a fenced block in the fence the prompt uses
    (mini-swe-agent's text-based config parses ``mswea_bash_command``)."""
    _, url = served
    client = openai.OpenAI(base_url=url, api_key="k")
    system = "Reply with one ```mswea_bash_command``` block."
    messages: list[Any] = [
        {"role": "system", "content": system},
        {"role": "user", "content": "run: echo step-one"},
    ]
    first = client.chat.completions.create(model="m", messages=messages).choices[0].message
    assert first.content is not None
    assert "```mswea_bash_command\necho step-one\n```" in first.content
    messages += [
        {"role": "assistant", "content": first.content},
        {"role": "user", "content": "step-one"},
    ]
    last = client.chat.completions.create(model="m", messages=messages).choices[0].message
    assert last.content == "Done."


def test_plan_grammar_and_shell_schemas() -> None:
    conv = Conversation(
        texts=(),
        last_user="",
        tool_names=frozenset(),
        tool_output=None,
        user_texts=("write 'a b' to dir/x.txt then run: ls -1 dir", "older"),
    )
    assert plan(conv) == ["printf '%s\\n' 'a b' > dir/x.txt", "cat dir/x.txt", "ls -1 dir"]
    # The newest user message naming a step wins; one naming none falls through.
    assert plan(Conversation((), "", frozenset(), None, user_texts=("run: a", "hi"))) == ["a"]
    codex_shell = {"type": "function", "name": "shell", "parameters": _schema("command", "array")}
    shell = find_shell([codex_shell])
    assert shell is not None and shell.argv and shell.argument == "command"
    # exec_command is preferred over shell when both are offered.
    both = [codex_shell, {"type": "function", "name": "exec_command", "parameters": _schema("cmd")}]
    assert find_shell(both) == find_shell(both[1:])
    assert find_shell([{"name": "Read", "input_schema": _schema("path")}]) is None


def test_array_argument_shell_runs_an_argv(
    served: tuple[ScriptedModel, str], tmp_path: Path
) -> None:
    _, url = served
    client = openai.OpenAI(base_url=url, api_key="k")
    tools: Any = [{"type": "function", "name": "shell", "parameters": _schema("command", "array")}]
    response = client.responses.create(model="m", input="run: echo hi > f", tools=tools)
    (call,) = [o for o in response.output if o.type == "function_call"]
    argv = json.loads(call.arguments)["command"]
    assert argv == ["bash", "-lc", "echo hi > f"]
    sh(argv, tmp_path)
    assert (tmp_path / "f").read_text() == "hi\n"


def test_an_mcp_served_shell_with_a_required_timeout(served: tuple[ScriptedModel, str]) -> None:
    """Claude Code's ACP adapter offers its shell as ``mcp__acp__Bash`` with ``timeout``
    required (milliseconds); the call names the served tool and fills the timeout."""
    _, url = served
    schema = _schema()
    schema["properties"]["timeout"] = {"type": "number", "maximum": 120000}
    schema["required"] = ["command", "timeout"]
    tools: Any = [{"name": "mcp__acp__Bash", "input_schema": schema}]
    client = anthropic.Anthropic(base_url=url.removesuffix("/v1"), api_key="k")
    reply = client.messages.create(
        model="m", max_tokens=64, tools=tools, messages=[{"role": "user", "content": TASK}]
    )
    (use,) = [b for b in reply.content if b.type == "tool_use"]
    assert use.name == "mcp__acp__Bash"
    assert use.input == {"command": "printf '%s\\n' 'hello agent' > out.txt", "timeout": 60000}
    # An unprefixed shell is still preferred over a served one of the same name.
    plain = {"name": "Bash", "input_schema": _schema()}
    assert find_shell([*tools, plain]) == find_shell([plain])


def test_a_later_user_message_starts_a_plan_of_its_own(
    served: tuple[ScriptedModel, str],
) -> None:
    """A resumed session: the conversation holds the first plan's actions, then a new user
    message whose plan starts from its first step."""
    _, url = served
    client = openai.OpenAI(base_url=url, api_key="k")
    tools: Any = [{"type": "function", "function": {"name": "bash", "parameters": _schema()}}]

    def call(i: int, command: str) -> dict[str, Any]:
        arguments = json.dumps({"command": command})
        function = {"name": "bash", "arguments": arguments}
        return {
            "role": "assistant",
            "tool_calls": [{"id": f"c{i}", "type": "function", "function": function}],
        }

    messages: list[Any] = [
        {"role": "user", "content": 'Write "one" to a.txt.'},
        call(1, "printf '%s\\n' one > a.txt"),
        {"role": "tool", "tool_call_id": "c1", "content": ""},
        call(2, "cat a.txt"),
        {"role": "tool", "tool_call_id": "c2", "content": "one"},
        {"role": "assistant", "content": "Done. one"},
        {"role": "user", "content": 'Now write "two" to b.txt.'},
    ]
    reply = client.chat.completions.create(model="m", messages=messages, tools=tools)
    (tool_call,) = reply.choices[0].message.tool_calls or []
    assert json.loads(tool_call.function.arguments) == {"command": "printf '%s\\n' two > b.txt"}
