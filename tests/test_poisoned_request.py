"""A poisoned request in a real run: the scripted model server behind a proxy that answers 500 to
every prompt containing ``POISON`` (as an endpoint answers a prompt that crashes it), the rest
answered as usual. The poisoned group arrives with its errors after a few attempts instead of
holding the run on an endpoint circuit until ``retry.max_outage`` (900 s), and the other groups
are not held."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import vfray as vf
from vfray.endpoints.serving import serve_in_thread
from vfray.testing import ScriptedModel


class PoisonProxy:
    """ASGI: 500 for a request whose body contains ``marker``, otherwise ``inner``'s answer."""

    def __init__(self, inner: Any, marker: bytes) -> None:
        self.inner, self.marker = inner, marker
        self.poisoned = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.inner(scope, receive, send)
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if self.marker in body:
            self.poisoned += 1
            payload = json.dumps({"error": {"message": "internal error", "type": "server"}})
            await send(
                {
                    "type": "http.response.start",
                    "status": 500,
                    "headers": [(b"content-type", b"application/json")],
                }
            )
            await send({"type": "http.response.body", "body": payload.encode()})
            return
        sent = False

        async def replay() -> dict[str, Any]:
            nonlocal sent
            if sent:
                return {"type": "http.disconnect"}
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.inner(scope, replay, send)


@pytest.fixture
def poisoned_endpoint() -> Iterator[tuple[str, PoisonProxy]]:
    proxy = PoisonProxy(ScriptedModel("arithmetic"), b"POISON")
    with serve_in_thread(proxy) as url:
        yield f"{url}/v1", proxy


class QA(vf.TaskData):
    answer: str


class Sum(vf.Task[QA]):
    @vf.reward
    def correct(self, trace: vf.Trace) -> bool:
        return (trace.last_reply or "").strip() == self.data.answer


def _farm(url: str, tmp_path: Path) -> vf.Farm:
    # The default circuit (5 failures in a row) and max_outage (900 s); quick backoffs.
    config = vf.EvalConfig.model_validate(
        {"retry": {"backoff": 0.05, "max_backoff": 0.2, "provider_retries": 6}}
    )
    return vf.Farm(
        "scripted",
        base_url=url,
        config=config,
        harness="null",
        backend="local",
        output_dir=str(tmp_path),
        progress=False,
    )


def test_a_poisoned_group_alone_in_flight_arrives_with_its_errors(
    poisoned_endpoint: tuple[str, PoisonProxy], tmp_path: Path
) -> None:
    url, proxy = poisoned_endpoint
    task = Sum(QA(prompt="POISON: what is 1 + 1?", answer="2"), key="poisoned")
    with _farm(url, tmp_path) as farm:
        result = farm.run([task], rollouts_per_task=4)
    traces = result.traces.to_pylist()
    final = [t for t in traces if t["trace_id"] in set(result.final_traces["trace_id"].to_pylist())]
    assert len(final) == 4
    assert {t["error_type"] for t in final} == {"ProviderError"}
    # 4 first attempts and at most one retry each (the fifth failure in a row, all this
    # task's, judged the request poisoned): far under the budget of 7 attempts per rollout,
    # and no wait on a circuit.
    assert 4 <= len(traces) <= 8, len(traces)
    assert max(t["attempt"] for t in traces) <= 1
    assert proxy.poisoned >= len(traces)


def test_a_poisoned_group_does_not_hold_the_others(
    poisoned_endpoint: tuple[str, PoisonProxy], tmp_path: Path
) -> None:
    url, _proxy = poisoned_endpoint
    tasks = [
        Sum(QA(prompt=f"What is {i} + {i}?", answer=str(2 * i)), key=f"ok{i}") for i in range(4)
    ]
    tasks.insert(1, Sum(QA(prompt="POISON: what is 1 + 1?", answer="2"), key="poisoned"))
    with _farm(url, tmp_path) as farm:
        result = farm.run(tasks, rollouts_per_task=4)
    final = result.final_traces.to_pylist()
    by_task: dict[str, list[dict[str, Any]]] = {}
    for row in final:
        by_task.setdefault(row["task_key"], []).append(row)
    assert len(by_task) == 5 and all(len(rows) == 4 for rows in by_task.values())
    assert {r["error_type"] for r in by_task.pop("poisoned")} == {"ProviderError"}
    assert all(r["ok"] and r["reward"] == 1.0 for rows in by_task.values() for r in rows)
    others = [r for r in result.traces.to_pylist() if r["task_key"] != "poisoned"]
    assert all(r["attempt"] == 0 for r in others)  # nobody else failed or waited
