"""The built-in chat loop's own HTTP client (plain HTTP over a socket, urllib for https and
proxies), against real servers on 127.0.0.1 that answer the way uvicorn and proxies do."""

from __future__ import annotations

import contextlib
import importlib.util
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

PROGRAM = Path(__file__).resolve().parents[1] / "vfray/harnesses/programs/chat_loop.py"


@pytest.fixture(scope="module")
def chat_loop() -> ModuleType:
    spec = importlib.util.spec_from_file_location("chat_loop_under_test", PROGRAM)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class OneShotServer:
    """Accepts connections, keeps each request it read, answers each with ``reply``."""

    def __init__(self, reply: bytes) -> None:
        self.reply = reply
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
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head, _, body = data.partition(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                while len(body) < length:
                    body += conn.recv(65536)
                self.requests.append(head + b"\r\n\r\n" + body)
                conn.sendall(self.reply)

    def close(self) -> None:
        # A thread blocked in accept() keeps a merely closed socket listening: shut it down.
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self.thread.join(timeout=5)


@pytest.fixture
def serve() -> Iterator[type[OneShotServer]]:
    started: list[OneShotServer] = []

    class Tracked(OneShotServer):
        def __init__(self, reply: bytes) -> None:
            super().__init__(reply)
            started.append(self)

    yield Tracked
    for server in started:
        server.close()


def test_a_chunked_reply_is_reassembled(
    chat_loop: ModuleType, serve: type[OneShotServer], monkeypatch: pytest.MonkeyPatch
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
    chat_loop: ModuleType, serve: type[OneShotServer], monkeypatch: pytest.MonkeyPatch
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
    chat_loop: ModuleType, serve: type[OneShotServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = serve(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
    for var in (*chat_loop._PROXY_VARS, "no_proxy", "NO_PROXY"):
        monkeypatch.delenv(var, raising=False)  # urllib skips an empty no_proxy, not a set one
    monkeypatch.setenv("http_proxy", f"http://127.0.0.1:{proxy.port}")
    _, body = chat_loop.http_post("http://model.example:8000/v1/chat", b"{}", {}, 5.0)
    assert body == b"{}"
    # A forward proxy is sent the whole URL on the request line.
    assert proxy.requests[0].startswith(b"POST http://model.example:8000/v1/chat HTTP/1.1")
