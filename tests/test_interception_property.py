"""Property test: arbitrary bodies and headers at every interception route never yield a 5xx
(the upstream is healthy) and never touch another session's trace."""

from __future__ import annotations

import asyncio
import json
import string
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vfray.interception import Interception, Upstream
from vfray.models.scripted.server import scripted_server
from vfray.trace import TaskRecord, Trace

FINAL_STATUS = {
    "/v1/chat/completions": 401,
    "/v1/responses": 400,
    "/v1/messages": 403,
    "/v1/messages/count_tokens": 403,
}
ROUTES = [
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/responses"),
    ("POST", "/v1/messages"),
    ("GET", "/v1/models"),
    ("GET", "/health"),
    ("POST", "/v1/models"),
    ("POST", "/v1/unknown"),
    ("POST", "/v1/messages/count_tokens"),
]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
roles = st.sampled_from(["user", "assistant", "system", "tool", "", 3, None])
messages = st.lists(
    st.fixed_dictionaries(
        {"role": roles},
        optional={
            "content": json_values,
            "tool_calls": json_values,
            "tool_call_id": json_values,
            "type": st.sampled_from(["message", "function_call", "function_call_output", "x"]),
        },
    ),
    max_size=4,
)
near_valid = st.fixed_dictionaries(
    {},
    optional={
        "messages": messages | json_values,
        "input": messages | json_values,
        "stream": st.booleans() | json_values,
        "tools": json_values,
        "system": json_values,
        "max_tokens": st.integers(-5, 50) | json_values,
        "model": json_values,
    },
)
bodies = st.one_of(
    st.binary(max_size=200),
    json_values.map(lambda v: json.dumps(v).encode()),
    near_valid.map(lambda v: json.dumps(v).encode()),
)
header_text = st.text(alphabet=string.ascii_letters + string.digits + " -_=/.", max_size=30).map(
    str.strip
)


class Served:
    """The proxy and the scripted model, on a loop of their own in a thread."""

    def __init__(self, upstream_url: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.icpt = Interception(Upstream(upstream_url, model="m"), max_body_bytes=4096)
        asyncio.run_coroutine_threadsafe(self.icpt.__aenter__(), self.loop).result(10)

    def close(self) -> None:
        future = asyncio.run_coroutine_threadsafe(self.icpt.__aexit__(None, None, None), self.loop)
        future.result(15)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    with scripted_server("echo") as url:
        served = Served(url)
        try:
            yield served
        finally:
            served.close()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    route=st.sampled_from(ROUTES),
    body=bodies,
    auth=st.sampled_from(["mine", "bearer-garbage", "x-api-key-mine", "none", "concluded"]),
    retry=st.none() | header_text,
    content_type=st.none() | header_text,
)
def test_no_5xx_and_no_cross_session_effects(
    served: Served,
    route: tuple[str, str],
    body: bytes,
    auth: str,
    retry: str | None,
    content_type: str | None,
) -> None:
    app = served.icpt.app
    mine, other, gone = (Trace(task=TaskRecord(key=k, hash=k)) for k in "abc")
    secret, other_secret = app.register(mine), app.register(other)
    concluded = app.register(gone)
    app.conclude(concluded)
    headers: dict[str, Any] = {}
    if auth == "mine":
        headers["authorization"] = f"Bearer {secret}"
    elif auth == "x-api-key-mine":
        headers["x-api-key"] = secret
    elif auth == "bearer-garbage":
        headers["authorization"] = f"Bearer {other_secret[::-1]}"
    elif auth == "concluded":
        headers["authorization"] = f"Bearer {concluded}"
    if retry is not None:
        headers["x-stainless-retry-count"] = retry
    if content_type is not None:
        headers["content-type"] = content_type
    method, path = route
    with httpx.Client(base_url=served.icpt.root_url, timeout=30) as http:
        if method == "GET":
            response = http.get(path, headers=headers)
        else:
            response = http.post(path, content=body, headers=headers)
    try:
        assert response.status_code < 500, response.text
        if auth == "concluded" and route in (*ROUTES[:3], ROUTES[-1]):
            # Each dialect's final status (what its agents give up on at once), not 409.
            assert response.status_code == FINAL_STATUS[route[1]], response.text
            assert "concluded" in response.text
            assert response.headers["x-should-retry"] == "false"
        assert other.calls == [] and gone.calls == [] and other.stop_condition is None
        if auth not in ("mine", "x-api-key-mine"):
            assert mine.calls == []
    finally:
        app.conclude(secret)
        app.conclude(other_secret)
