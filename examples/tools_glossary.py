"""Example taskset with a shared MCP toolset: one glossary server for the whole run (one per
node on Ray), each rollout's lookups counted in its own state
(``self.state``), which no other rollout sees.

Run: ``vfray eval examples/tools_glossary.py:GlossaryTaskset -n 4 -r 2 --harness bash
-m scripted:agent``.
"""

from __future__ import annotations

from collections.abc import Sequence

import vfray as vf
from vfray.tools import Scope, ToolFailed

TERMS = {
    "rollout": "one attempt of an agent at a task",
    "trace": "the typed record of a rollout",
    "harness": "the agent program that drives the model",
    "runtime": "the box a harness runs in",
}


class Glossary(vf.Toolset):
    """Look terms up in a fixed glossary; counts this rollout's lookups."""

    scope = Scope.SHARED

    @vf.tool
    def define(self, term: str) -> str:
        """The definition of ``term``."""
        self.state["lookups"] = self.state.get("lookups", 0) + 1
        if term not in TERMS:
            raise ToolFailed(f"{term!r} is not in the glossary")
        return TERMS[term]

    @vf.tool
    def lookups(self) -> int:
        """How many terms this rollout has looked up so far."""
        return int(self.state.get("lookups", 0))


class TermData(vf.TaskData):
    term: str


class TermTask(vf.Task[TermData]):
    def toolsets(self) -> Sequence[vf.Toolset]:
        return [Glossary()]

    @vf.reward
    def defined(self, trace: vf.Trace) -> bool:
        return TERMS[self.data.term] in (trace.last_reply or "")

    @vf.metric
    def own_lookups(self, trace: vf.Trace) -> float:
        counts = [c.result for c in trace.tool_calls if c.name == "lookups"]
        return float(counts[-1]) if counts and counts[-1] else -1.0


class GlossaryTaskset(vf.Taskset[TermTask]):
    def load(self) -> list[TermTask]:
        return [
            TermTask(
                TermData(
                    prompt=f'tool: define {{"term": "{term}"}}\ntool: lookups\n'
                    f'tool: define {{"term": "{term}"}}',
                    term=term,
                )
            )
            for term in TERMS
        ]
