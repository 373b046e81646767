"""The built-in chat loop's own HTTP client (plain HTTP over a socket, one connection kept for
the next call; urllib for https and proxies), against real servers on 127.0.0.1 that answer the
way uvicorn and proxies do, and in a bwrap box behind its egress gate."""

from __future__ import annotations

import contextlib
import importlib.util
import shutil
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import vfray as vf
from vfray.interception.app import InterceptionApp
from vfray.runtimes.base import Runtime

PROGRAM = Path(__file__).resolve().parents[1] / "vfray/harnesses/programs/chat_loop.py"


@pytest.fixture(scope="module")
def chat_loop() -> ModuleType:
    spec = importlib.util.spec_from_file_location("chat_loop_under_test", PROGRAM)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class HttpServer:
    """Answers each request with the next of ``replies`` (the last one repeated) and closes the
    connection after its reply, or with ``keep_alive`` reads the connection's next request;
    keeps each request it read (head and body) and counts the connections it accepted."""

    def __init__(self, replies: bytes | list[bytes], keep_alive: bool = False) -> None:
        self.replies = [replies] if isinstance(replies, bytes) else replies
        self.keep_alive = keep_alive
        self.connections = 0
        self.requests: list[bytes] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while True:
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                head, _, data = data.partition(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                while len(data) < length:
                    data += conn.recv(65536)
                self.requests.append(head + b"\r\n\r\n" + data[:length])
                data = data[length:]
                conn.sendall(self.replies[min(len(self.requests), len(self.replies)) - 1])
                if not self.keep_alive:
                    return

    def close(self) -> None:
        # A thread blocked in accept() keeps a merely closed socket listening: shut it down.
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self.thread.join(timeout=5)


@pytest.fixture
def serve() -> Iterator[type[HttpServer]]:
    started: list[HttpServer] = []

    class Tracked(HttpServer):
        def __init__(self, replies: bytes | list[bytes], keep_alive: bool = False) -> None:
            super().__init__(replies, keep_alive)
            started.append(self)

    yield Tracked
    for server in started:
        server.close()


def test_a_chunked_reply_is_reassembled(
    chat_loop: ModuleType, serve: type[HttpServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in chat_loop._PROXY_VARS:
        monkeypatch.delenv(var, raising=False)
    server = serve(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
        b'Mcp-Session-Id: abc\r\n\r\n5\r\n{"a":\r\n3\r\n 1}\r\n0\r\n\r\n'
    )
    headers, body = chat_loop.http_post(
        f"http://127.0.0.1:{server.port}/v1/x?y=1", b'{"q": 2}', {"X-Test": "1"}, 5.0
    )
    assert body == b'{"a": 1}'
    assert headers["mcp-session-id"] == "abc"
    request = server.requests[0]
    assert request.startswith(b"POST /v1/x?y=1 HTTP/1.1\r\n")
    assert b"X-Test: 1\r\n" in request and request.endswith(b'{"q": 2}')


def test_an_error_status_carries_its_body_and_a_closed_port_is_an_os_error(
    chat_loop: ModuleType, serve: type[HttpServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in chat_loop._PROXY_VARS:
        monkeypatch.delenv(var, raising=False)
    server = serve(b"HTTP/1.1 429 Too Many\r\nContent-Length: 4\r\n\r\nslowEXTRA")
    with pytest.raises(chat_loop.HttpError) as info:
        chat_loop.http_post(f"http://127.0.0.1:{server.port}/v1", b"{}", {}, 5.0)
    assert info.value.status == 429 and info.value.body == b"slow"
    port = server.port
    server.close()
    with pytest.raises(OSError):
        chat_loop.http_post(f"http://127.0.0.1:{port}/v1", b"{}", {}, 5.0)


def test_a_proxy_in_the_environment_is_honoured(
    chat_loop: ModuleType, serve: type[HttpServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = serve(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
    for var in (*chat_loop._PROXY_VARS, "no_proxy", "NO_PROXY"):
        monkeypatch.delenv(var, raising=False)  # urllib skips an empty no_proxy, not a set one
    monkeypatch.setenv("http_proxy", f"http://127.0.0.1:{proxy.port}")
    _, body = chat_loop.http_post("http://model.example:8000/v1/chat", b"{}", {}, 5.0)
    assert body == b"{}"
    # A forward proxy is sent the whole URL on the request line.
    assert proxy.requests[0].startswith(b"POST http://model.example:8000/v1/chat HTTP/1.1")


@pytest.fixture
def no_proxy(chat_loop: ModuleType, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for var in (*chat_loop._PROXY_VARS, "no_proxy", "NO_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(chat_loop, "_KEPT", {})
    yield
    for conn in chat_loop._KEPT.values():
        conn.close()


LENGTH_REPLY = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 8\r\n\r\n"


@pytest.mark.usefixtures("no_proxy")
def test_model_calls_share_one_kept_connection(
    chat_loop: ModuleType, serve: type[HttpServer]
) -> None:
    # Each call on a connection of its own cost the interception an accept, a protocol and a
    # close. Framed by length and by chunks alike, each reply ends where it should: the next
    # one on the same connection reads whole.
    server = serve(
        [
            LENGTH_REPLY + b'{"n": 1}',
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            b'4\r\n{"n"\r\n4\r\n: 2}\r\n0\r\n\r\n',
            LENGTH_REPLY + b'{"n": 3}',
        ],
        keep_alive=True,
    )
    url = f"http://127.0.0.1:{server.port}/v1/chat/completions"
    bodies = [chat_loop.http_post(url, b"{}", {}, 5.0, keep_alive=True)[1] for _ in range(3)]
    assert bodies == [b'{"n": 1}', b'{"n": 2}', b'{"n": 3}']
    assert server.connections == 1
    assert all(b"connection: close" not in request.lower() for request in server.requests)


@pytest.mark.usefixtures("no_proxy")
def test_a_kept_connection_the_server_closed_is_replaced_and_a_close_reply_is_not_kept(
    chat_loop: ModuleType, serve: type[HttpServer]
) -> None:
    # A server that ends each connection after its reply (a restart, an idle timeout): the
    # next call finds its kept connection closed and goes again on a new one, once.
    server = serve(LENGTH_REPLY + b'{"n": 1}')
    url = f"http://127.0.0.1:{server.port}/v1"
    for _ in range(3):
        assert chat_loop.http_post(url, b"{}", {}, 5.0, keep_alive=True)[1] == b'{"n": 1}'
    assert server.connections == 3 and len(server.requests) == 3
    # A reply that says it closes the connection leaves nothing kept.
    reply = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}"
    closing = serve(reply, keep_alive=True)
    chat_loop.http_post(f"http://127.0.0.1:{closing.port}/v1", b"{}", {}, 5.0, keep_alive=True)
    assert ("127.0.0.1", closing.port) not in chat_loop._KEPT


@pytest.mark.usefixtures("no_proxy")
def test_a_host_no_proxy_names_goes_over_the_socket_not_the_proxy(
    chat_loop: ModuleType,
    serve: type[HttpServer],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A box's egress gate sets a proxy and names the interception in no_proxy: its calls must
    # not fall back to urllib (its import cost the box ~30 ms of CPU per rollout, and it opens
    # a connection per call).
    proxy = serve(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
    model = serve(LENGTH_REPLY + b'{"n": 1}', keep_alive=True)
    monkeypatch.setenv("http_proxy", f"http://127.0.0.1:{proxy.port}")
    monkeypatch.setenv("no_proxy", "localhost,127.0.0.1,::1")
    url = f"http://127.0.0.1:{model.port}/v1"
    for _ in range(2):
        assert chat_loop.http_post(url, b"{}", {}, 5.0, keep_alive=True)[1] == b'{"n": 1}'
    assert model.connections == 1 and proxy.requests == []
    # A domain entry covers its subdomains, and "*" every host; other hosts use the proxy.
    monkeypatch.setenv("no_proxy", ".example.org")
    assert not chat_loop._proxied("api.example.org", "api.example.org:8000")
    assert chat_loop._proxied("example.com", "example.com")
    monkeypatch.setenv("no_proxy", "*")
    assert not chat_loop._proxied("example.com", "example.com")


class WriteFile(vf.Task[vf.TaskData]):
    @vf.reward
    async def wrote_it(self, runtime: Runtime) -> bool:
        return (await runtime.read("out.txt")) == b"hello agent\n"


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="no bwrap")
async def test_a_bash_rollout_in_bwrap_makes_its_calls_on_one_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The box's egress gate puts a proxy in its environment and the interception in no_proxy:
    # the program's three calls reach the interception over one connection, none through urllib.
    seen: list[tuple[Any, bytes | None]] = []
    serve_call = InterceptionApp.__call__

    async def spy(self: InterceptionApp, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].endswith("/chat/completions"):
            seen.append((scope["client"], dict(scope["headers"]).get(b"connection")))
        await serve_call(self, scope, receive, send)

    monkeypatch.setattr(InterceptionApp, "__call__", spy)
    # Not bwrap's default work dir /work: it would hide a host venv under /work.
    prompt = 'Write "hello agent" to out.txt, then check it.'
    task = WriteFile(vf.TaskData(prompt=prompt, workdir="/box"))
    trace = await vf.run_rollout(task, model="scripted:agent", harness="bash", runtime="bwrap")
    assert trace.ok and trace.reward == 1.0, trace.errors
    assert len(seen) == len(trace.calls) == 3
    assert len({client for client, _ in seen}) == 1, seen
    assert all(connection is None for _, connection in seen), seen
