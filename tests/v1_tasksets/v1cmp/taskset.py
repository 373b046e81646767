# mypy: ignore-errors
"""Written against verifiers.v1 only (docs/v1/tasksets.md): the same file runs under
verifiers 0.4.0 and under vfray's v1 layer. Each task's ``kind`` picks what it exercises."""

from __future__ import annotations

import verifiers.v1 as vf

UV_SCRIPT = """# /// script
# dependencies = []
# ///
import sys
print(int(sys.argv[1]) * 2)
"""

ROWS = [
    ("plain", 1, 2, "What is 1 + 2?"),
    ("plain", 4, 4, "What is 4 + 4?"),
    ("runtime", 2, 3, "What is 2 + 3?"),
    ("stop_trace", 1, 1, "What is 1 + 1?"),
    ("stop_request", 2, 2, "halt: What is 2 + 2?"),
    ("stop_response", 3, 4, "What is 3 + 4?"),
]
ODD_ROWS = [
    ("sync_hook", 3, 3, "What is 3 + 3?"),
    ("raising_hook", 2, 6, "What is 2 + 6?"),
    ("stop_nonbool", 5, 5, "What is 5 + 5?"),
]
"""Where v1 and vfray differ (the README's table), with ``odd = true``."""


class CmpData(vf.TaskData):
    a: int
    b: int
    answer: int
    kind: str = "plain"


class CmpTask(vf.Task[CmpData]):
    @vf.reward
    async def correct(self, trace: vf.Trace) -> float:
        return float(trace.last_reply == str(self.data.answer))

    @vf.reward(weight=0.5)
    async def parts(self, trace, task) -> dict:
        # v1 injects the task's data as `task`; a mapping records one reward per key.
        return {"has_reply": float(bool(trace.last_reply)), "even": float(task.answer % 2 == 0)}

    @vf.metric
    async def turns(self, trace: vf.Trace) -> float:
        return float(trace.num_turns)

    @vf.metric
    async def box_sum(self, trace, runtime) -> float:
        if trace.task.data.kind != "runtime":
            return -1.0
        result = await runtime.run(["sh", "-c", f"echo $(({self.data.a} + {self.data.b}))"], {})
        return float(result.stdout.strip())

    @vf.metric
    async def uv_double(self, runtime) -> float:
        if self.data.kind != "runtime":
            return -1.0
        result = await runtime.run_uv_script(UV_SCRIPT, [str(self.data.answer)])
        return float(result.stdout.strip())

    @vf.stop
    async def stop_now(self, trace: vf.Trace) -> bool:
        return trace.task.data.kind == "stop_trace"

    @vf.stop
    async def halt_request(self, request: vf.Request) -> bool:
        return self.data.kind == "stop_request" and any(
            "halt" in str(m.content) for m in request.messages
        )

    @vf.stop
    async def seven_reply(self, response: vf.Response) -> bool:
        return self.data.kind == "stop_response" and "7" in (response.message.content or "")


class SyncTask(CmpTask):
    @vf.metric
    def reply_len(self, trace: vf.Trace) -> float:  # a sync hook
        return float(len(trace.last_reply or ""))


class OddTask(CmpTask):
    @vf.metric
    async def fails(self, trace: vf.Trace) -> float:
        if self.data.kind == "raising_hook":
            raise ValueError("this hook fails on purpose")
        return 0.0

    @vf.stop
    async def not_a_bool(self, trace: vf.Trace):
        return "yes" if self.data.kind == "stop_nonbool" else False


class CmpConfig(vf.TasksetConfig):
    kinds: list[str] = []
    """Only the tasks of these kinds (all when empty)."""
    odd: bool = False
    """Also the rows where v1 and vfray differ (ODD_ROWS)."""


class CmpTaskset(vf.Taskset[CmpTask, CmpConfig]):
    def load(self):
        for kind, a, b, prompt in ROWS + (ODD_ROWS if self.config.odd else []):
            if self.config.kinds and kind not in self.config.kinds:
                continue
            data = CmpData(prompt=prompt, a=a, b=b, answer=a + b, kind=kind)
            cls = {"sync_hook": SyncTask, "raising_hook": OddTask, "stop_nonbool": OddTask}
            yield cls.get(kind, CmpTask)(data, self.config.task)
