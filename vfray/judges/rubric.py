"""The rubric judge: a verdict per criterion, the reward their weighted share of yes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from vfray.endpoints.client import ModelEndpoint
from vfray.judges.base import Judge, View
from vfray.trace import Trace

if TYPE_CHECKING:
    from vfray.task import Task

RUBRIC_PROMPT = """\
Grade the response to the task against each criterion.

Task:
```
{prompt}
```

Response:
```
{response}
```

Criteria:
{criteria}

Respond with ONLY a JSON object: {"verdicts": [{"name": "<criterion name>", "reason": "<one \
sentence citing the response>", "verdict": "yes" or "no"}, ...]}, one entry per criterion, \
using each criterion's exact name."""


class Criterion(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    description: str
    weight: float = Field(1.0, ge=0)


class Verdict(BaseModel):
    name: str
    reason: str = ""
    verdict: str


class Verdicts(BaseModel):
    verdicts: list[Verdict]


class RubricJudge(Judge[Verdicts]):
    """Asks for a yes/no verdict (with a reason) per criterion, as JSON (also requested as a
    JSON-schema response format unless ``structured=False``); the reward is the weighted
    share of yes. A criterion missing from the answer, or a verdict other than yes/no, is
    asked again, then a :class:`~vfray.errors.JudgeError`."""

    prompt = RUBRIC_PROMPT
    schema = Verdicts

    def __init__(
        self,
        criteria: Sequence[Criterion | Mapping[str, Any]],
        *,
        prompt: str | None = None,
        structured: bool = True,
        endpoint: ModelEndpoint | None = None,
        retries: int = 2,
        view: View = "last_reply",
        weight: float = 1.0,
        priority: int = 0,
        name: str | None = None,
    ) -> None:
        self.criteria = [c if isinstance(c, Criterion) else Criterion(**c) for c in criteria]
        if not self.criteria:
            raise ValueError("a rubric needs at least one criterion")
        names = [c.name for c in self.criteria]
        if len(set(names)) != len(names):
            raise ValueError(f"criterion names must be unique, got {names}")
        if sum(c.weight for c in self.criteria) <= 0:
            raise ValueError("the criteria's weights sum to 0")
        super().__init__(
            prompt,
            structured=structured,
            endpoint=endpoint,
            retries=retries,
            view=view,
            weight=weight,
            priority=priority,
            name=name,
        )

    def parse(self, text: str) -> Verdicts:
        verdicts = super().parse(text)
        given = {v.name: v.verdict.strip().lower() for v in verdicts.verdicts}
        missing = [c.name for c in self.criteria if c.name not in given]
        if missing:
            raise ValueError(f"no verdict for {', '.join(missing)}")
        odd = {n: v for n, v in given.items() if v not in ("yes", "no")}
        if odd:
            raise ValueError(f"verdicts must be yes or no, got {odd}")
        return verdicts

    def fields(self, task: Task[Any], trace: Trace) -> dict[str, Any]:
        lines = "\n".join(f"- {c.name}: {c.description}" for c in self.criteria)
        return {**super().fields(task, trace), "criteria": lines}

    def to_score(self, parsed: Verdicts) -> float:
        given = {v.name: v.verdict.strip().lower() for v in parsed.verdicts}
        total = sum(c.weight for c in self.criteria)
        return sum(c.weight for c in self.criteria if given[c.name] == "yes") / total
