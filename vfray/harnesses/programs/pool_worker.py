"""One warm agent process that runs many rollouts' bash-tool chat loops at once (the ``pool``
harness). Stdlib only; imports nothing of vfray.

It speaks JSON lines on stdio. In: ``start`` (a job: the rollout's endpoint, secret, model and
messages; the secret never touches argv or the environment), ``output`` (a command's result) and
``cancel``. Out: ``exec`` (a command for the harness to run in that rollout's own box) and
``done`` (the job's end: exit code, final answer, error). Each job is a thread: a job that fails
ends alone, the process and the other jobs go on. The process ends when its stdin closes, or
when the process that started it dies.
"""

from __future__ import annotations

import contextlib
import ctypes
import http.client
import json
import queue
import signal
import sys
import threading
import urllib.parse
from typing import Any

BASH_TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a bash command in the task's box and get its output.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "The command."}},
            "required": ["command"],
        },
    },
}
_write = threading.Lock()


def send(message: dict[str, Any]) -> None:
    line = json.dumps(message) + "\n"
    with _write:
        sys.stdout.write(line)
        sys.stdout.flush()


class Cancelled(Exception):
    pass


class Refused(Exception):
    """A 4xx from the interception: a limit or a stop; the job ends at once, no retry."""


class Job:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.id = spec["job"]
        self.spec = spec
        self.outputs: queue.Queue[str | None] = queue.Queue()
        self.cancelled = threading.Event()

    def post(self, body: dict[str, Any]) -> dict[str, Any]:
        url = urllib.parse.urlsplit(self.spec["url"].rstrip("/") + "/chat/completions")
        conn = http.client.HTTPConnection(
            url.hostname or "127.0.0.1", url.port or 80, timeout=self.spec["request_timeout"]
        )
        try:
            conn.request(
                "POST",
                url.path,
                json.dumps(body),
                {"content-type": "application/json", "authorization": f"Bearer {self.spec['key']}"},
            )
            answer = conn.getresponse()
            raw = answer.read()
        finally:
            conn.close()
        if 400 <= answer.status < 500:
            raise Refused(f"HTTP {answer.status}: {raw[:300].decode(errors='replace')}")
        if answer.status != 200:
            raise RuntimeError(f"HTTP {answer.status}: {raw[:300].decode(errors='replace')}")
        result: dict[str, Any] = json.loads(raw)
        return result

    def run_command(self, call: int, command: str) -> str:
        send({"op": "exec", "job": self.id, "call": call, "command": command})
        output = self.outputs.get()
        if output is None or self.cancelled.is_set():
            raise Cancelled()
        return output

    def run(self) -> None:
        messages: list[dict[str, Any]] = list(self.spec["messages"])
        answer = ""
        for step in range(self.spec["max_steps"]):
            if self.cancelled.is_set():
                raise Cancelled()
            body = {"model": self.spec["model"], "messages": messages, "tools": [BASH_TOOL]}
            message = self.post(body)["choices"][0]["message"]
            calls = message.get("tool_calls") or []
            messages.append(
                {
                    "role": "assistant",
                    "content": message.get("content") or "",
                    **({"tool_calls": calls} if calls else {}),
                }
            )
            if not calls:
                answer = message.get("content") or ""
                break
            for n, call in enumerate(calls):
                try:
                    command = json.loads(call["function"]["arguments"] or "{}")["command"]
                    output = self.run_command(step * 100 + n, str(command))
                except (ValueError, KeyError, TypeError) as exc:
                    output = f"error: bad tool call ({exc})"
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": output})
        send({"op": "done", "job": self.id, "exit_code": 0, "answer": answer})


def work(job: Job, jobs: dict[str, Job]) -> None:
    try:
        job.run()
    except Cancelled:
        send({"op": "done", "job": job.id, "exit_code": 143, "error": "cancelled"})
    except Refused as exc:
        send({"op": "done", "job": job.id, "exit_code": 1, "error": f"refused: {exc}"})
    except Exception as exc:  # one job's failure is that job's, never the process's
        send({"op": "done", "job": job.id, "exit_code": 2, "error": f"{type(exc).__name__}: {exc}"})
    finally:
        jobs.pop(job.id, None)


def main() -> int:
    # PR_SET_PDEATHSIG: end with the process that started us, however it ends.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)
    jobs: dict[str, Job] = {}
    send({"op": "ready"})
    for line in sys.stdin:
        message = json.loads(line)
        op, job_id = message.get("op"), message.get("job")
        if op == "start":
            job = jobs[job_id] = Job(message)
            threading.Thread(target=work, args=(job, jobs), daemon=True).start()
        elif op == "output" and job_id in jobs:
            jobs[job_id].outputs.put(message["output"])
        elif op == "cancel" and job_id in jobs:
            jobs[job_id].cancelled.set()
            jobs[job_id].outputs.put(None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
