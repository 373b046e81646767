"""vfray.tools below the rollout: a tool's JSON schema from its typed parameters, calls validated
and run (sync tools in a thread with the rollout's state), results as text, intercepts chained,
calls recorded on a binding, the host MCP listener spoken to over real HTTP on loopback, and a
stdio MCP program in a subprocess box. tests/test_tools.py drives the same parts through
rollouts."""

from __future__ import annotations

import asyncio
import enum
import sys
from pathlib import Path
from typing import Any, Literal

import httpx
import pytest
from pydantic import BaseModel, ValidationError

import vfray as vf
from vfray.errors import ToolError
from vfray.runtimes.subprocess import SubprocessRuntime
from vfray.tools import McpServer, Scope, ToolFailed
from vfray.tools._mcp_app import Binding, list_tools, run_call
from vfray.tools._stdio import StdioServer
from vfray.tools.host import HostToolServer, host_server
from vfray.tools.toolset import task_toolsets

pytest.importorskip("mcp")

# --- schemas from typed parameters --------------------------------------------------------------


class Colour(str, enum.Enum):
    RED = "red"
    BLUE = "blue"


class Point(BaseModel):
    x: int
    y: int = 0


class Typed(vf.Toolset):
    @vf.tool
    def plain(self, text: str, count: int = 2, ratio: float = 0.5, loud: bool = False) -> str:
        """Repeats text.

        Everything after the first paragraph stays out of the description."""
        return text * count

    @vf.tool
    def shapes(
        self,
        tags: list[str],
        mode: Literal["fast", "slow"] = "fast",
        colour: Colour = Colour.RED,
        where: Point | None = None,
        note: str | None = None,
    ) -> dict[str, Any]:
        return {"tags": tags, "mode": mode, "colour": colour, "where": where, "note": note}

    @vf.tool(name="renamed")
    def some_method(self) -> str:
        return "ok"

    def not_a_tool(self, x: int) -> int:
        return x


def test_scalar_parameters_become_typed_properties_with_defaults() -> None:
    spec = Typed.specs()["plain"]
    assert spec.description == "Repeats text."
    assert spec.input_schema == {
        "type": "object",
        "properties": {
            "text": {"type": "string"},
            "count": {"type": "integer", "default": 2},
            "ratio": {"type": "number", "default": 0.5},
            "loud": {"type": "boolean", "default": False},
        },
        "required": ["text"],
        "additionalProperties": False,
    }
    assert spec.as_mcp() == {
        "name": "plain",
        "description": "Repeats text.",
        "inputSchema": spec.input_schema,
    }


def test_lists_literals_enums_models_and_optionals_are_described() -> None:
    schema = Typed.specs()["shapes"].input_schema
    props = schema["properties"]
    assert schema["required"] == ["tags"]
    assert props["tags"] == {"type": "array", "items": {"type": "string"}}
    assert props["mode"] == {"enum": ["fast", "slow"], "type": "string", "default": "fast"}
    assert props["colour"]["default"] == "red"
    assert schema["$defs"]["Colour"]["enum"] == ["red", "blue"]
    assert schema["$defs"]["Point"]["required"] == ["x"]
    assert {"type": "null"} in props["note"]["anyOf"] and props["note"]["default"] is None
    assert Typed.specs()["shapes"].description == ""  # no docstring, no description


def test_only_marked_methods_are_tools_under_their_given_names() -> None:
    specs = Typed.specs()
    assert set(specs) == {"plain", "shapes", "renamed"}
    assert specs["renamed"].method == "some_method"
    assert Typed.specs() is not Typed.specs()  # a copy: callers cannot edit the class's cache


def test_a_subclass_adds_tools_to_its_parents() -> None:
    class More(Typed):
        @vf.tool
        def extra(self) -> str:
            return "x"

    assert set(More.specs()) == {"plain", "shapes", "renamed", "extra"}
    assert "extra" not in Typed.specs()


def test_a_tool_that_cannot_be_described_is_refused_naming_it() -> None:
    class NoHints(vf.Toolset):
        @vf.tool
        def f(self, x) -> str:  # type: ignore[no-untyped-def]
            return str(x)

    class Star(vf.Toolset):
        @vf.tool
        def g(self, *names: str) -> str:
            return ""

    class Kw(vf.Toolset):
        @vf.tool
        def h(self, **options: int) -> str:
            return ""

    with pytest.raises(TypeError, match=r"tool NoHints.f: parameter 'x' has no type hint"):
        NoHints.specs()
    with pytest.raises(TypeError, match=r"tool Star.g: \*args/\*\*kwargs cannot be described"):
        Star.specs()
    with pytest.raises(TypeError, match=r"tool Kw.h: \*args/\*\*kwargs"):
        Kw.specs()


@pytest.mark.parametrize(
    ("cls_name", "explicit", "server"),
    [
        ("Scratchpad", "", "scratchpad"),
        ("WebSearchTools", "", "web_search_tools"),
        ("HTTPClient", "", "h_t_t_p_client"),
        ("Anything", "kb", "kb"),
    ],
)
def test_the_server_name_is_given_or_the_class_name_in_snake_case(
    cls_name: str, explicit: str, server: str
) -> None:
    cls = type(cls_name, (vf.Toolset,), {"name": explicit})
    assert cls.server_name() == server


# --- calls --------------------------------------------------------------------------------------


class Stateful(vf.Toolset):
    scope = Scope.SHARED
    call_timeout = 0.5

    @vf.tool
    def remember(self, value: str) -> str:
        """Sync: runs in a thread with the rollout's state."""
        self.state.setdefault("seen", []).append(value)
        return ",".join(self.state["seen"])

    @vf.tool
    async def recall(self) -> list[str]:
        return list(self.state.get("seen", []))

    @vf.tool
    def point(self, x: int) -> Point:
        return Point(x=x)

    @vf.tool
    def odd(self) -> dict[str, Any]:
        return {"path": Path("/tmp/a"), "text": "é"}

    @vf.tool
    async def slow(self) -> str:
        await asyncio.sleep(30)
        return "late"

    @vf.tool
    def refuse(self, why: str = "no") -> str:
        raise ToolFailed(f"refused: {why}")


async def test_each_rollouts_state_is_its_own_on_a_shared_instance() -> None:
    toolset = Stateful()
    mine: dict[str, Any] = {}
    theirs: dict[str, Any] = {}
    assert await toolset.call("remember", {"value": "a"}, mine) == "a"
    assert await toolset.call("remember", {"value": "b"}, theirs) == "b"
    assert await toolset.call("remember", {"value": "c"}, mine) == "a,c"
    assert await toolset.call("recall", {}, mine) == '["a", "c"]'
    assert mine == {"seen": ["a", "c"]} and theirs == {"seen": ["b"]}
    # Without a rollout's state (a direct call), the instance's own dict serves.
    assert await toolset.call("remember", {"value": "z"}) == "z"
    assert toolset.state == {"seen": ["z"]}


@pytest.mark.parametrize(
    ("name", "arguments", "text"),
    [
        ("point", {"x": 3}, '{"x":3,"y":0}'),
        ("point", {"x": "4"}, '{"x":4,"y":0}'),  # validated, coerced as pydantic does
        ("odd", {}, '{"path": "/tmp/a", "text": "é"}'),  # not JSON-native: str()
        ("recall", {}, "[]"),
    ],
)
async def test_results_that_are_not_text_become_json(
    name: str, arguments: dict[str, Any], text: str
) -> None:
    assert await Stateful().call(name, arguments, {}) == text


@pytest.mark.parametrize(
    ("name", "arguments", "match"),
    [
        ("nope", {}, r"unknown tool 'nope'; available: odd, point, recall, refuse, remember, slow"),
        ("point", {}, r"(?s)invalid arguments for point: .*x\n  Field required"),
        ("point", {"x": "many"}, r"(?s)invalid arguments for point: .*valid integer"),
        ("point", {"x": 1, "z": 2}, r"(?s)invalid arguments for point: .*Extra inputs"),
        ("refuse", {"why": "policy"}, r"^refused: policy$"),
    ],
)
async def test_bad_calls_are_tool_failures_the_model_sees(
    name: str, arguments: dict[str, Any], match: str
) -> None:
    with pytest.raises(ToolFailed, match=match):
        await Stateful().call(name, arguments, {})


async def test_a_call_past_its_timeout_raises_timeout() -> None:
    with pytest.raises(TimeoutError):
        await Stateful().call("slow", {}, {})


class Chained(vf.Toolset):
    @vf.tool
    def secret(self, who: str) -> str:
        return f"{who}: hunter2 / sk-123"

    @vf.intercept
    def a_passwords(self, name: str, arguments: dict[str, Any], result: str) -> str | None:
        return result.replace("hunter2", "[pw]") if "hunter2" in result else None

    @vf.intercept
    def b_keys(self, name: str, arguments: dict[str, Any], result: str) -> str | None:
        return result.replace("sk-123", "[key]") if name == "secret" else None


def test_intercepts_apply_in_name_order_each_seeing_the_last_rewrite() -> None:
    toolset = Chained()
    assert toolset.intercept_result("secret", {}, "ada: hunter2 / sk-123") == "ada: [pw] / [key]"
    assert toolset.intercept_result("other", {}, "hunter2") == "[pw]"
    assert toolset.intercept_result("other", {}, "nothing to hide") is None
    assert Typed().intercept_result("plain", {}, "x") is None


def test_an_external_server_needs_exactly_one_way_in() -> None:
    assert McpServer(name="u", url="http://h/mcp").command is None
    assert McpServer(name="c", command=("srv", "--stdio")).url is None
    for bad in ({}, {"url": "http://h/mcp", "command": ("srv",)}):
        with pytest.raises(ValidationError, match="exactly one of url= or command="):
            McpServer(name="x", **bad)
    server = McpServer(name="c", command=("srv",))
    with pytest.raises(ValidationError):
        server.name = "other"  # type: ignore[misc]


def test_a_tasks_tool_servers_must_have_distinct_names() -> None:
    class WithTools:
        def __init__(self, *sources: Any) -> None:
            self.sources = sources

        def toolsets(self) -> Any:
            return self.sources

    assert task_toolsets(object()) == []
    sources = [Typed(), McpServer(name="web", url="http://h/mcp")]
    assert task_toolsets(WithTools(*sources)) == sources
    with pytest.raises(ValueError, match=r"two tool servers share a name: \['typed', 'typed'\]"):
        task_toolsets(WithTools(Typed(), McpServer(name="typed", url="http://h/mcp")))


# --- calls recorded on a binding ----------------------------------------------------------------


async def test_a_binding_records_every_call_with_its_outcome() -> None:
    seen: list[Any] = []

    class Small(Stateful):
        max_result_chars = 5

    binding = Binding(server="stateful", toolset=Small(), on_call=seen.append)
    assert await run_call(binding, "remember", {"value": "ab"}) == ("ab", False)
    assert await run_call(binding, "remember", {"value": "cdef"}) == (
        "tool 'remember' returned 7 characters, over the limit of 5",
        True,
    )
    text, is_error = await run_call(binding, "slow", {})
    assert (text, is_error) == ("tool 'slow' timed out after 0.5s", True)
    text, is_error = await run_call(binding, "refuse", {})
    assert (text, is_error) == ("refused: no", True)
    assert [c.name for c in binding.calls] == ["remember", "remember", "slow", "refuse"]
    assert seen == binding.calls
    ok, huge, slow, refused = binding.calls
    assert ok.result == "ab" and ok.error is None and ok.ended_at >= ok.started_at
    assert huge.result is not None and huge.error is not None and huge.error.type == "ToolError"
    assert slow.error is not None and "timed out" in (slow.error.message or "")
    assert refused.arguments == {} and refused.error is not None
    assert binding.state == {"seen": ["ab", "cdef"]}  # the call ran; its result was refused


async def test_a_rewritten_result_keeps_the_original_on_the_call() -> None:
    binding = Binding(server="chained", toolset=Chained())
    assert await run_call(binding, "secret", {"who": "ada"}) == ("ada: [pw] / [key]", False)
    (call,) = binding.calls
    assert call.original_result == "ada: hunter2 / sk-123"


async def test_a_forwarded_call_keeps_the_servers_error_flag_and_its_failures() -> None:
    async def forward(name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        if name == "hang":
            await asyncio.sleep(30)
        if name == "crash":
            raise ConnectionResetError("peer went away")
        return f"{name}:{arguments.get('q')}", name == "bad"

    async def tools() -> list[dict[str, Any]]:
        return [{"name": "find", "inputSchema": {"type": "object"}}]

    binding = Binding(server="ext", forward=forward, list_tools=tools, call_timeout=0.2)
    assert await run_call(binding, "find", {"q": 1}) == ("find:1", False)
    assert await run_call(binding, "bad", {}) == ("bad:None", True)
    assert await run_call(binding, "hang", {}) == ("tool 'hang' timed out after 0.2s", True)
    assert await run_call(binding, "crash", {}) == (
        "tool 'crash' raised ConnectionResetError: peer went away",
        True,
    )
    assert [c.error is None for c in binding.calls] == [True, True, False, False]
    assert await list_tools(binding) == [{"name": "find", "inputSchema": {"type": "object"}}]


# --- the host listener over HTTP ----------------------------------------------------------------

HEADERS = {"Accept": "application/json, text/event-stream"}


async def _rpc(client: httpx.AsyncClient, url: str, method: str, **params: Any) -> Any:
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    response = await client.post(url, json=body, headers=HEADERS)
    assert response.status_code == 200, response.text
    return response.json()


async def test_the_host_listener_serves_each_binding_at_its_own_token() -> None:
    server = host_server()
    assert host_server() is server  # one per event loop
    first = Binding(server="stateful", toolset=Stateful())
    second = Binding(server="chained", toolset=Chained())
    url1, url2 = await server.bind(first), await server.bind(second)
    assert url1.startswith("http://127.0.0.1:") and url1.rsplit("/", 2)[0] == url2.rsplit("/", 2)[0]
    async with httpx.AsyncClient() as client:
        listed = await _rpc(client, url1, "tools/list")
        assert sorted(t["name"] for t in listed["result"]["tools"]) == sorted(Stateful.specs())
        called = await _rpc(client, url1, "tools/call", name="remember", arguments={"value": "v"})
        assert called["result"] == {"content": [{"type": "text", "text": "v"}], "isError": False}
        failed = await _rpc(client, url1, "tools/call", name="refuse", arguments={})
        assert failed["result"]["isError"] is True
        assert failed["result"]["content"][0]["text"] == "refused: no"
        other = await _rpc(client, url2, "tools/call", name="secret", arguments={"who": "b"})
        assert other["result"]["content"][0]["text"] == "b: [pw] / [key]"
        base = url1.rsplit("/", 1)[0]
        for path in (f"{base}/unknown-token", f"{base}/a/b", base.rsplit("/", 1)[0] + "/other"):
            missing = await client.post(path, json={}, headers=HEADERS)
            assert (missing.status_code, missing.json()) == (404, {"error": "no such tool session"})
        await server.unbind(url1)
        gone = await client.post(url1, json={}, headers=HEADERS)
        assert gone.status_code == 404  # an ended rollout's token answers no more
        assert server.url is not None  # the other rollout's binding keeps the listener
        await server.unbind(url2)
    assert server.url is None and server.bindings == {}
    assert [c.name for c in first.calls] == ["remember", "refuse"]
    assert first.state == {"seen": ["v"]}


def test_a_shared_toolset_has_one_instance_per_class_and_name() -> None:
    server = HostToolServer()
    one, two = Stateful(), Stateful()
    assert server.shared_instance(one) is one
    assert server.shared_instance(two) is one
    renamed = type("Renamed", (Stateful,), {"name": "other"})()
    assert server.shared_instance(renamed) is renamed


# --- a stdio MCP program in a box ---------------------------------------------------------------

STDIO = r"""
import json, sys
mode = sys.argv[1]
if mode == "exit":
    sys.exit(0)
for line in sys.stdin:
    msg = json.loads(line)
    if "id" not in msg:
        continue  # a notification
    print("a log line, not JSON", flush=True)
    print(json.dumps({"jsonrpc": "2.0", "id": 999, "result": {}}), flush=True)  # not ours
    method = msg["method"]
    if method == "initialize":
        result = {"protocolVersion": msg["params"]["protocolVersion"], "capabilities": {}}
    elif method == "tools/list":
        result = {"tools": [{"name": "echo", "inputSchema": {"type": "object"}}]}
    elif method == "tools/call" and msg["params"]["name"] == "echo":
        args = msg["params"]["arguments"]
        result = {"content": [{"type": "text", "text": args["text"]}, {"type": "image"}, "x"],
                  "isError": args.get("fail", False)}
    else:
        print(json.dumps({"jsonrpc": "2.0", "id": msg["id"],
                          "error": {"code": -32601, "message": "no " + method}}), flush=True)
        continue
    print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}), flush=True)
"""


async def test_a_stdio_server_is_spoken_to_in_json_rpc_lines(tmp_path: Path) -> None:
    async with SubprocessRuntime(root=str(tmp_path)) as box:
        argv = [sys.executable, "-c", STDIO, "serve"]
        server = await StdioServer.start(box, "echoer", argv, {}, timeout=30)
        try:
            assert await server.list_tools() == [
                {"name": "echo", "inputSchema": {"type": "object"}}
            ]
            # Parts that are not text come through empty; a non-dict part is skipped.
            assert await server.call("echo", {"text": "hi"}) == ("hi\n", False)
            assert await server.call("echo", {"text": "no", "fail": True}) == ("no\n", True)
            with pytest.raises(ToolError, match=r"tool server 'echoer': .*no tools/call"):
                await server.call("other", {})
            texts = await asyncio.gather(*(server.call("echo", {"text": str(i)}) for i in range(5)))
            assert [t for t, _ in texts] == [f"{i}\n" for i in range(5)]  # one in flight at a time
        finally:
            await server.close()


async def test_a_stdio_server_that_exits_or_never_answers_did_not_start(tmp_path: Path) -> None:
    async with SubprocessRuntime(root=str(tmp_path)) as box:
        with pytest.raises(ToolError, match=r"tool server 'gone' \(.*\) did not start: .*exited"):
            await StdioServer.start(box, "gone", [sys.executable, "-c", STDIO, "exit"], {}, 30)
        mute = [sys.executable, "-c", "import time; time.sleep(60)"]
        with pytest.raises(ToolError, match=r"tool server 'mute' \(.*\) did not start"):
            await StdioServer.start(box, "mute", mute, {}, timeout=0.5)
