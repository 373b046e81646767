"""The ``pool`` harness: one warm agent process (``programs/pool_worker.py``, a bash-tool chat
loop) runs the rollouts of a harness object at once, instead of a program started per rollout.

Third-party agents take their model key from the environment when they start, so one process
of theirs cannot serve rollouts that each have their own secret; this agent takes the endpoint
and the secret per job on its stdin. It runs on the node, next to the interception, and runs no
model-written code itself: each command goes back to the harness, which runs it in that
rollout's own box (``runtime.run``). So every rollout keeps its own box, secret and trace; a
job that fails ends alone; a stopped rollout's job is cancelled, its box's command killed. The
process starts with the first rollout and ends ``idle_seconds`` after the last one (or with
the process that started it). ``pooled=False`` starts one worker per rollout: the baseline the
pool is measured against (``benchmarks/pool.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import sys
import time
from importlib import resources
from typing import Any, ClassVar

from pydantic import Field

from vfray.errors import HarnessError
from vfray.harnesses.base import Harness, HarnessConfig, LaunchContext
from vfray.harnesses.chat import openai_base_url
from vfray.runtimes.base import ProgramResult, Runtime

_LINE_LIMIT = 64 * 1024 * 1024
"""Largest JSON line from the worker (a command is one line)."""


class PoolConfig(HarnessConfig):
    """Options of the pool harness."""

    max_steps: int = Field(30, gt=0)
    """Model calls per rollout before the loop gives up."""
    command_timeout: float = Field(120.0, gt=0)
    """Seconds one command may run in the box."""
    max_tool_output_chars: int = Field(10_000, gt=0)
    request_timeout: float = Field(600.0, gt=0)
    """Seconds one model call may take."""
    pooled: bool = True
    """One warm process for all rollouts; False: a fresh one per rollout (the baseline)."""
    idle_seconds: float = Field(2.0, ge=0)
    """The warm process ends once no rollout has used it for this long."""


def worker_source() -> str:
    return str(resources.files("vfray.harnesses") / "programs" / "pool_worker.py")


class Worker:
    """One worker process and the jobs in flight on it."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.jobs: dict[str, asyncio.Queue[dict[str, Any]]] = {}
        self.users = 0
        self._ids = itertools.count()
        self.gone = asyncio.Event()
        self._reader = asyncio.ensure_future(self._read())
        self._idle: asyncio.TimerHandle | None = None

    @classmethod
    async def start(cls) -> Worker:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-I",
            "-S",  # stdlib only: no site-packages scan
            worker_source(),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            limit=_LINE_LIMIT,
        )
        worker = cls(process)
        ready: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        worker.jobs["ready"] = ready
        await worker._unless_gone(ready.get())
        del worker.jobs["ready"]
        return worker

    @property
    def alive(self) -> bool:
        return self.process.returncode is None and not self._reader.done()

    async def _read(self) -> None:
        assert self.process.stdout is not None
        async for line in self.process.stdout:
            message = json.loads(line)
            queue = self.jobs.get(message.get("job") or message.get("op"))
            if queue is not None:
                queue.put_nowait(message)
        await self.process.wait()  # its exit code, for the message
        self.gone.set()  # the process is gone: every job in flight ends

    def _ended(self) -> HarnessError:
        return HarnessError(
            f"the pool's worker process ended (exit code {self.process.returncode})"
        )

    async def send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(json.dumps(message).encode() + b"\n")
            await self.process.stdin.drain()
        except (ConnectionError, RuntimeError) as exc:
            raise self._ended() from exc

    async def _unless_gone(self, work: Any) -> Any:
        """``work``'s result, or the worker's end as a HarnessError if that comes first."""
        task = asyncio.ensure_future(work)
        gone = asyncio.ensure_future(self.gone.wait())
        try:
            await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if task.cancelled():
            raise self._ended()
        return task.result()

    async def run_job(self, spec: dict[str, Any], runtime: Runtime, c: PoolConfig) -> ProgramResult:
        job = f"j{next(self._ids)}"
        inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.jobs[job] = inbox
        started = time.monotonic()
        try:
            await self.send({"op": "start", "job": job, **spec})
            while True:
                message = await self._unless_gone(inbox.get())
                if message["op"] == "exec":
                    output = await self._unless_gone(_run_command(runtime, message["command"], c))
                    await self.send(
                        {"op": "output", "job": job, "call": message["call"], "output": output}
                    )
                elif message["op"] == "done":
                    return ProgramResult(
                        exit_code=message["exit_code"],
                        stdout=message.get("answer", ""),
                        stderr=message.get("error", ""),
                        duration=time.monotonic() - started,
                    )
        except asyncio.CancelledError:
            # The rollout was stopped: the job ends, the process and its other jobs go on.
            with contextlib.suppress(Exception):
                await self.send({"op": "cancel", "job": job})
            raise
        finally:
            del self.jobs[job]

    async def close(self, grace: float = 2.0) -> None:
        if self.process.stdin is not None and not self.process.stdin.is_closing():
            self.process.stdin.close()  # EOF: the worker ends by itself
        try:
            await asyncio.wait_for(self.process.wait(), grace)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
            await self.process.wait()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader


async def _run_command(runtime: Runtime, command: str, c: PoolConfig) -> str:
    try:
        result = await runtime.run(["bash", "-c", command], dict(c.env), timeout=c.command_timeout)
    except Exception as exc:  # the box's failure is this command's output, as in the chat loop
        return f"error: {type(exc).__name__}: {exc}"
    output = result.stdout + result.stderr
    if result.timed_out:
        output += f"\n[timed out after {c.command_timeout:g}s]"
    elif result.exit_code:
        output += f"\n[exit code {result.exit_code}]"
    limit = c.max_tool_output_chars
    if len(output) > limit:
        output = output[: limit // 2] + "\n[... output cut ...]\n" + output[-limit // 2 :]
    return output


class PoolHarness(Harness):
    """A bash-tool chat loop whose process serves every rollout of this harness object."""

    id = "pool"
    config_type: ClassVar[type[HarnessConfig]] = PoolConfig
    config: PoolConfig

    APPENDS_SYSTEM_PROMPT = True
    EXECUTES_CODE = True
    NEEDS_CONTAINER = False

    def __init__(self, config: HarnessConfig | dict[str, Any] | None = None) -> None:
        super().__init__(config)
        self._worker: Worker | None = None
        self._starting: asyncio.Lock | None = None
        self._closing: set[asyncio.Future[None]] = set()
        self.workers_started = 0
        """How many worker processes this harness has started (1 per run when pooled)."""

    async def setup(self, runtime: Runtime) -> None:
        return None  # the agent runs on the node; the box only runs its commands

    async def _acquire(self) -> Worker:
        if not self.config.pooled:
            self.workers_started += 1
            return await Worker.start()
        loop = asyncio.get_running_loop()
        if self._starting is None or getattr(self._starting, "_vfray_loop", None) is not loop:
            # A harness object outlives an event loop (one vf.run_rollout each): a worker of a
            # loop that is gone is ended here and a new one started on this loop.
            if self._worker is not None:
                with contextlib.suppress(ProcessLookupError):
                    self._worker.process.kill()
                self._worker = None
            self._starting = asyncio.Lock()
            self._starting._vfray_loop = loop  # type: ignore[attr-defined]
        async with self._starting:
            worker = self._worker
            if worker is None or not worker.alive:
                worker = self._worker = await Worker.start()
                self.workers_started += 1
            if worker._idle is not None:
                worker._idle.cancel()
                worker._idle = None
            worker.users += 1
            return worker

    def _release(self, worker: Worker) -> None:
        if not self.config.pooled:
            closing = asyncio.ensure_future(worker.close())
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)
            return
        worker.users -= 1
        if worker.users == 0:
            loop = asyncio.get_running_loop()
            worker._idle = loop.call_later(
                self.config.idle_seconds, lambda: asyncio.ensure_future(self._retire(worker))
            )

    async def _retire(self, worker: Worker) -> None:
        if worker.users == 0:
            if self._worker is worker:
                self._worker = None
            await worker.close()

    @property
    def worker_pid(self) -> int | None:
        """The warm worker's PID while it runs (None when none does)."""
        worker = self._worker
        return worker.process.pid if worker is not None and worker.alive else None

    async def launch(self, ctx: LaunchContext, runtime: Runtime) -> ProgramResult:
        c = self.config
        spec = {
            "url": openai_base_url(ctx.endpoint),
            "key": ctx.secret,
            "model": ctx.model,
            "messages": self.resolve_prompt(ctx.data),
            "max_steps": c.max_steps,
            "request_timeout": c.request_timeout,
        }
        worker = await self._acquire()
        try:
            return await asyncio.wait_for(worker.run_job(spec, runtime, c), ctx.timeout)
        except TimeoutError:
            return ProgramResult(exit_code=124, timed_out=True, stderr="the agent budget ran out")
        finally:
            self._release(worker)
