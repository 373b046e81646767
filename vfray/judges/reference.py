"""The reference-answer judge: is the agent's reply the task's reference answer in substance?"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from vfray.endpoints.client import ModelEndpoint
from vfray.judges.base import Judge, View
from vfray.trace import Trace

if TYPE_CHECKING:
    from vfray.task import Task

REFERENCE_PROMPT = """\
Given a task, a reference answer and a response, decide whether the response is correct: it \
must match the reference answer in substance (the wording may differ).

Task:
```
{prompt}
```

Reference answer:
```
{answer}
```

Response:
```
{response}
```

Respond either "{positive}" or "{negative}" only."""


class ReferenceJudge(Judge[bool]):
    """1.0 when the judge says the reply matches the task's ``answer_field`` (a list: any
    one of them), else 0.0. A verdict that is neither label is asked again, then a
    :class:`~vfray.errors.JudgeError`; an empty reply scores 0 without a call."""

    prompt = REFERENCE_PROMPT

    def __init__(
        self,
        *,
        answer_field: str = "answer",
        choices: tuple[str, str] = ("yes", "no"),
        prompt: str | None = None,
        endpoint: ModelEndpoint | None = None,
        retries: int = 2,
        view: View = "last_reply",
        weight: float = 1.0,
        priority: int = 0,
        name: str | None = None,
    ) -> None:
        if not all(choices) or choices[0].lower() == choices[1].lower():
            raise ValueError(f"choices needs two distinct, non-empty labels, got {choices!r}")
        super().__init__(
            prompt,
            endpoint=endpoint,
            retries=retries,
            view=view,
            weight=weight,
            priority=priority,
            name=name,
        )
        self.answer_field = answer_field
        self.choices = choices

    def parse(self, text: str) -> bool:
        words = re.findall(r"[\w-]+", text.lower())
        positive, negative = (c.lower() for c in self.choices)
        for word in words:
            if word == positive:
                return True
            if word == negative:
                return False
        raise ValueError(
            f"the verdict is neither {self.choices[0]!r} nor {self.choices[1]!r}: {text[:200]!r}"
        )

    def fields(self, task: Task[Any], trace: Trace) -> dict[str, Any]:
        answer = getattr(task.data, self.answer_field, None)
        if answer is None:
            raise ValueError(f"the task has no {self.answer_field!r} field (answer_field)")
        if isinstance(answer, list | tuple):
            answer = "\n".join(str(a) for a in answer)
        positive, negative = self.choices
        return {
            **super().fields(task, trace),
            "answer": answer,
            "positive": positive,
            "negative": negative,
        }

    async def score(self, task: Task[Any], trace: Trace) -> float:
        fields = self.fields(task, trace)
        if not str(fields["response"]).strip():
            return 0.0  # nothing to grade: no call
        answer = await self.evaluate(trace=trace, **fields)
        return 1.0 if answer.parsed else 0.0
