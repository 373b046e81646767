"""The ``oracle`` harness: no model, the task's reference solution. It uploads the folder the
task names in ``solution_dir`` (Harbor's ``solution/``) to ``/solution`` and runs
``solve.sh`` there with bash, in the box's work dir. A task of several steps (``steps``, each
with its own ``solution_dir``) gets the next step's solution at each segment.

``vfray validate harbor:PATH`` runs it on every task to find the ones that are not solvable.
"""

from __future__ import annotations

import contextlib
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vfray.errors import HarnessError
from vfray.harnesses.base import Harness, LaunchContext
from vfray.runtimes.base import ProgramResult, Runtime
from vfray.trace import Message

SOLUTION = "/solution"
LOG = "/logs/agent/oracle.txt"
STEP_FILE = "/tmp/.vfray-oracle-step"
"""The next step's index, kept in the box: one harness serves many rollouts at once."""


class OracleHarness(Harness):
    """Runs the task's ``solve.sh``; calls no model."""

    id = "oracle"
    SUPPORTS_RESUME = True
    EXECUTES_CODE = True
    NEEDS_CONTAINER = False

    async def _solution(self, data: Any, runtime: Runtime) -> str:
        steps = list(getattr(data, "steps", None) or [])
        if not steps:
            folder = getattr(data, "solution_dir", None)
            if not folder:
                raise HarnessError("the oracle needs a task with a solution (solution/solve.sh)")
            return str(folder)
        try:
            index = int((await runtime.read(STEP_FILE)).decode().strip() or 0)
        except Exception:  # no file yet: the first step
            index = 0
        await runtime.write(STEP_FILE, str(index + 1).encode())
        if index >= len(steps) or not getattr(steps[index], "solution_dir", None):
            raise HarnessError(f"the oracle has no solution for step {index + 1}")
        return str(steps[index].solution_dir)

    async def _run(self, ctx: LaunchContext, runtime: Runtime) -> ProgramResult:
        folder = Path(await self._solution(ctx.data, runtime))
        clear = await runtime.run(["/bin/sh", "-c", f"rm -rf {SOLUTION} && mkdir -p {SOLUTION}"])
        if not clear.ok:
            raise HarnessError(f"cannot make {SOLUTION} in the box: {clear.stderr.strip()}")
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                rel = path.relative_to(folder).as_posix()
                mode = path.stat().st_mode & 0o777
                await runtime.write(f"{SOLUTION}/{rel}", path.read_bytes(), mode=mode)
        env = dict(getattr(ctx.data, "solution_env", None) or {})
        argv = ["bash", f"{SOLUTION}/solve.sh"]
        result = await runtime.run_program(argv, {**self.config.env, **env}, timeout=ctx.timeout)
        log = f"$ {shlex.join(argv)} (exit {result.exit_code})\n{result.stdout}\n{result.stderr}"
        with contextlib.suppress(Exception):  # the log is a courtesy; the result counts
            await runtime.write(LOG, log.encode())
        return result

    async def launch(self, ctx: LaunchContext, runtime: Runtime) -> ProgramResult:
        return await self._run(ctx, runtime)

    async def resume(
        self, ctx: LaunchContext, runtime: Runtime, messages: Sequence[Message]
    ) -> ProgramResult:
        return await self._run(ctx, runtime)
